#!/usr/bin/env bash
# Makes a relocatable bundle of attention-server, attention-loadgen and the server-side GPU
# tests (tests/gpu/gpu_*_test) (DESIGN.md §11) for GPU hosts that lack
# gRPC/spdlog/prometheus-cpp: the binaries plus every non-system shared library
# they link (from ldd), leaving out libc/libm/libstdc++/libgcc, the CUDA driver, cuBLAS and
# cuDNN (the host's own CUDA 13 toolkit provides those).
# Usage: scripts/bundle.sh [BUILD_DIR] [OUT_DIR]   (defaults: build, .bundle/attn)
# Then on the host: .bundle/attn/run.sh attention-server --default-backend naive ...
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}
out=${2:-$root/.bundle/attn}
rm -rf "$out"
mkdir -p "$out/bin" "$out/lib"
cp "$build/server/attention-server" "$build/client/attention-loadgen" "$out/bin/"
# The protos with their comments, for grpcurl -protoset (proto/CMakeLists.txt).
if [ -f "$build/proto/attention.protoset" ]; then
  mkdir -p "$out/share" && cp "$build/proto/attention.protoset" "$out/share/"
fi
# Server-side GPU tests (they link the server runtime, so they cannot be built on the host).
for t in "$build"/tests/gpu/gpu_*_test; do
  if [ -x "$t" ]; then cp "$t" "$out/bin/"; fi
done
skip='^(linux-vdso|ld-linux|libc\.so|libm\.so|libstdc\+\+|libgcc_s|libpthread|libdl\.so|librt\.so|libcuda\.so|libcublas|libcublasLt|libcudnn|libnvidia)'
for b in "$out"/bin/*; do
  ldd "$b" | awk '/=>/ {print $1, $3}' | while read -r name path; do
    if [[ "$name" =~ $skip ]] || [ ! -f "$path" ]; then continue; fi
    cp -L -n "$path" "$out/lib/$name"
  done
done
# Debug info is not needed on the host and would make the bundle too large to carry.
strip --strip-unneeded "$out"/bin/* "$out"/lib/* 2>/dev/null || true
ln -s ../../client/data "$out/data" 2>/dev/null || true
cat > "$out/run.sh" <<'RUN'
#!/usr/bin/env bash
# Runs a bundled binary with the bundle's libraries first, then the host's CUDA libraries.
here=$(cd "$(dirname "$0")" && pwd)
cuda_lib=${CUDA_LIB_DIR:-/usr/local/cuda/lib64}
# cuDNN is not bundled: the binaries search for a compatible libcudnn.so.9 themselves
# (kernels/include/attn/kernels/cudnn_library.h; --cudnn-library names one).
export LD_LIBRARY_PATH="$here/lib:$cuda_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
exe=$1; shift
exec "$here/bin/$exe" "$@"
RUN
chmod +x "$out/run.sh"
du -sh "$out"
ls "$out/lib" | wc -l | xargs echo "libraries:"
