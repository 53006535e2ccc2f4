#!/usr/bin/env bash
# Configures and builds the project with CMake + Ninja.
# Usage: scripts/build.sh [--sanitize] [--cpu-only] [--build-dir DIR] [--target T]...
#                         [--configure-only] [-- extra cmake args]
#   --sanitize   ASan+UBSan host build (implies --cpu-only), default dir build-asan
#   --cpu-only   no CUDA even when nvcc is present
#   --target T   build only target T (repeatable; default: everything, tests and benches too)
#   --no-tests   configure without the GoogleTest suites (-DATTN_TESTS=OFF; scripts/run.sh,
#                which installs no GoogleTest); otherwise -DATTN_TESTS=ON is passed, so a build
#                directory configured by run.sh gets its tests back
#   --configure-only  run CMake's configure step only (tests/deploy/image_build_test.sh)
# CUDA is used when nvcc is found (on PATH or in /usr/local/cuda/bin); archs default to 89;90a.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dir="$root/build"
args=()
tests=ON
targets=()
configure_only=0
while [ $# -gt 0 ]; do
  case "$1" in
    --sanitize) args+=(-DATTN_SANITIZE=ON -DATTN_CUDA=OFF); dir="$root/build-asan"; shift ;;
    --cpu-only) args+=(-DATTN_CUDA=OFF); shift ;;
    --build-dir) dir=$2; shift 2 ;;
    --target) targets+=(--target "$2"); shift 2 ;;
    --configure-only) configure_only=1; shift ;;
    --no-tests) tests=OFF; shift ;;
    --) shift; args+=("$@"); break ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH=/usr/local/cuda/bin:$PATH
fi
jobs=${ATTN_BUILD_JOBS:-$(nproc)}
cmake -S "$root" -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=${CMAKE_BUILD_TYPE:-RelWithDebInfo} \
  -DATTN_TESTS="$tests" "${args[@]}" >"$dir.configure.log" 2>&1 || { cat "$dir.configure.log"; exit 1; }
grep -E "^-- attn:" "$dir.configure.log" || true
if [ "$configure_only" = 1 ]; then echo "$dir"; exit 0; fi
cmake --build "$dir" -j "$jobs" "${targets[@]}"
echo "$dir"
