#!/usr/bin/env bash
# The container image's build recipe, the one place it is written: the Dockerfile's build stage
# runs it, and tests/deploy/image_build_test.sh runs the same steps on CI (no Docker engine
# there) and checks that the result has what the image promises (cudnn compiled in, CUDA archs
# 89;90a for fused).
# Usage:
#   scripts/image_build.sh bootstrap                  the build dependencies, incl. the pinned
#                                                     cuDNN + cudnn-frontend headers
#   scripts/image_build.sh configure BUILD_DIR        CMake configure only (what the test compares)
#   scripts/image_build.sh build BUILD_DIR BUNDLE_DIR configure, build the two binaries, bundle
#                                                     them (scripts/bundle.sh) plus the pinned
#                                                     libcudnn*.so.9 (BUNDLE_DIR/cudnn/)
# Configuration: scripts/build.sh's default, nothing added (CMAKE_BUILD_TYPE RelWithDebInfo,
# CUDA archs 89;90a from CMakeLists.txt, tests configured but not built), i.e. exactly CI's main
# build, so CI checks that build instead of compiling the CUDA kernels a second time.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
# --no-python: no test packages or deploy checkers in the image; --cudnn: the cuDNN headers
# anyway, and fail rather than build without them (the image promises the cudnn backend).
BOOTSTRAP_ARGS=(--no-python --cudnn)
unset CMAKE_BUILD_TYPE  # build.sh reads it; the image always uses build.sh's default

case "${1:-}" in
  bootstrap)
    exec "$root/scripts/bootstrap.sh" "${BOOTSTRAP_ARGS[@]}" ;;
  configure)
    exec "$root/scripts/build.sh" --build-dir "$2" --configure-only ;;
  build)
    build=$2 bundle=$3
    "$root/scripts/build.sh" --build-dir "$build" --target attention-server \
      --target attention-loadgen
    if ! grep -q '^ATTN_CUDNN_FOUND:INTERNAL=ON' "$build/CMakeCache.txt"; then
      echo "image_build: the cudnn backend was not built:" >&2
      grep '^ATTN_CUDNN_REASON' "$build/CMakeCache.txt" >&2 || true
      exit 1
    fi
    "$root/scripts/bundle.sh" "$build" "$bundle"
    # The pinned cuDNN (scripts/cudnn_pins.txt) goes with the binaries: the runtime image has
    # no other cuDNN and puts these on the loader path (/etc/ld.so.conf.d), where the server's
    # search finds them first (kernels/include/attn/kernels/cudnn_library.h).
    lib=$(sed -n 's/^CUDNN_LIBRARY:FILEPATH=//p' "$build/CMakeCache.txt")
    [ -f "$lib" ] || { echo "image_build: no libcudnn.so.9 found at build time" >&2; exit 1; }
    mkdir -p "$bundle/cudnn"
    cp -L "$(dirname "$lib")"/libcudnn*.so.9 "$bundle/cudnn/"
    ;;
  *)
    echo "usage: scripts/image_build.sh bootstrap | configure BUILD_DIR | build BUILD_DIR BUNDLE_DIR" >&2
    exit 2 ;;
esac
