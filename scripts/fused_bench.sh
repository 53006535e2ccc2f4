#!/usr/bin/env bash
# One command on a GPU host: build the kernel benchmark (Release, -DATTN_SERVER=OFF, Hopper
# image only by default) and run it next to PyTorch's SDPA backends (bench/attention_bench.py):
# roofline ceilings (bf16 matmul rate, copy bandwidth), correctness checks, timings, a JSON
# record in bench/results/<device>-<date>.json (and $OUT/ when set), a table printed last.
#
# Usage: scripts/fused_bench.sh [attention_bench.py options, e.g. --quick, --suites=b]
# Env:   BUILD_DIR (default build-bench), ARCHS (CMAKE_CUDA_ARCHITECTURES, default 90a),
#        PYTHON (default python3, the one with torch), JOBS (default nproc).
# Expected wall time on an H200: ~1 min build + ~3-5 min benchmark.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD_DIR=${BUILD_DIR:-$ROOT/build-bench}
ARCHS=${ARCHS:-90a}
PYTHON=${PYTHON:-python3}
JOBS=${JOBS:-$(nproc)}

t0=$(date +%s)
cmake -S "$ROOT" -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DATTN_SERVER=OFF \
  -DATTN_TESTS=OFF -DCMAKE_CUDA_ARCHITECTURES="$ARCHS" >/dev/null
cmake --build "$BUILD_DIR" --target attn_kernel_bench -j "$JOBS"
echo "[fused_bench] build took $(( $(date +%s) - t0 )) s" >&2
exec "$PYTHON" "$ROOT/bench/attention_bench.py" --bin "$BUILD_DIR/bench/attn_kernel_bench" "$@"
