#!/usr/bin/env bash
# One command on a GPU host: build the FP8 kernel benchmark (bench/fp8_bench.cu; Release,
# -DATTN_SERVER=OFF -DATTN_TESTS=OFF) and run it: correctness first, then our FP8 kernel (every
# variant, with and without quantisation of the bf16 inputs) against our bf16 fused kernel on
# the same shapes. JSON lines go to bench/results/<device>-<date>-fp8[-l4build].jsonl (and $OUT/
# when set); a table is printed last.
#
# Usage: scripts/fp8_bench.sh [attn_fp8_bench options, e.g. --quick, --shape=1,16,16,128,4096,4096,1]
# Env:   ARCHS (CMAKE_CUDA_ARCHITECTURES, default 90a), L4=1 (the L4 build of DESIGN.md §10:
#        ARCHS=89 and -DATTN_EMULATE_L4=ON; sm_89 PTX JIT-compiled on Hopper), BUILD_DIR (default
#        build-fp8-bench, or build-fp8-bench-l4), JOBS (default nproc).
# Expected wall time on an H200: ~1-2 min build + ~2-4 min benchmark (--quick: ~1 min).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
JOBS=${JOBS:-$(nproc)}
if [ "${L4:-0}" = 1 ]; then
  ARCHS=89
  EXTRA=(-DATTN_EMULATE_L4=ON)
  BUILD_DIR=${BUILD_DIR:-$ROOT/build-fp8-bench-l4}
  suffix=-fp8-l4build
else
  ARCHS=${ARCHS:-90a}
  EXTRA=(-DATTN_EMULATE_L4=OFF)
  BUILD_DIR=${BUILD_DIR:-$ROOT/build-fp8-bench}
  suffix=-fp8
fi
t0=$(date +%s)
cmake -S "$ROOT" -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DATTN_SERVER=OFF \
  -DATTN_TESTS=OFF -DCMAKE_CUDA_ARCHITECTURES="$ARCHS" "${EXTRA[@]}" >/dev/null
cmake --build "$BUILD_DIR" --target attn_fp8_bench -j "$JOBS"
echo "[fp8_bench] build (ARCHS=$ARCHS ${EXTRA[*]}) took $(( $(date +%s) - t0 )) s" >&2
device=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n1 |
         tr '[:upper:] ' '[:lower:]-' || echo unknown)
result="$ROOT/bench/results/${device:-unknown}-$(date -u +%Y-%m-%d)$suffix.jsonl"
mkdir -p "$ROOT/bench/results"
echo "{\"record\":\"command\",\"command\":\"L4=${L4:-0} ARCHS=$ARCHS scripts/fp8_bench.sh $*\"}" >"$result"
status=0
"$BUILD_DIR/bench/attn_fp8_bench" --out="$result" "$@" || status=$?
if [ -n "${OUT:-}" ]; then mkdir -p "$OUT" && cp "$result" "$OUT/"; fi
echo "[fp8_bench] results: $result (exit $status)" >&2
exit $status
