#!/usr/bin/env bash
# One command on a GPU host: build the decode benchmark (Release, -DATTN_SERVER=OFF, Hopper image
# only by default) and run it: a read-only streaming kernel (the bandwidth denominator), then
# decode B=32 N=32 K=8 H=128 T=1 at S in {1k, 8k, 32k} with bf16 and FP8 E4M3 pages, paged and
# contiguous, correctness checked first, CUDA-event medians of interleaved repeats; then, when
# torch is importable, PyTorch SDPA (flash, efficient, cudnn) on the same contiguous problem
# (bench/decode_peers.py). The binary then measures CUDA graphs for one paged bf16 decode batch
# (S=4096, B in {1, 8, 64}): direct PagedDecodeRun vs a captured graph replayed with
# cudaGraphLaunch, host wall time per launch+sync and CUDA-event time (--graph-sizes=...,
# --graph-iters=N, --no-graph). JSON to ${OUT:-.}/ and bench/results/; the tables are printed last.
#
# Usage: scripts/decode_bench.sh [--quick] [--sizes=1024,8192,32768] [--reps=7]
#          [--graph-sizes=1,8,64] [--no-graph] [--partitions=N (force the decode plans' split)]
# Env:   BUILD_DIR (default build-bench), ARCHS (CMAKE_CUDA_ARCHITECTURES, default 90a),
#        PYTHON (default python3, the one with torch), JOBS (default nproc), OUT (default .),
#        SKIP_PEERS=1 to skip the PyTorch peers.
# Expected wall time on an H200: ~1 min build + ~50 s benchmark (graphs ~10 s) + ~30 s peers.
#
# Paged prefill (--prefill): a prefill step over the paged KV cache, N=32 K=8 H=128 bf16,
# 16-token pages, bottom-right causal, B in {1, 8} x (T, S) in {(1024, 1024), (4096, 4096),
# (512, 4096)} (T = S: fresh prompt; T < S: over a cached prefix): the fused kernel reading
# K/V through the block tables (fused_paged) vs the same kernel and tile on the contiguous
# copy (fused_contig_tile) vs the fused default tile (fused_contig) vs the previous server path,
# 64-row chunks of split-KV decode (chunked_decode); correctness checked first, CUDA-event
# medians; JSON prefill-<device>-<date>.json, table last (no PyTorch peers):
#   OUT=out scripts/decode_bench.sh --prefill [--prefill-shapes=B:T:S,...] [--quick]
# Expected wall time of --prefill on an H200: ~1 min build + ~1-2 min benchmark.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD_DIR=${BUILD_DIR:-$ROOT/build-bench}
ARCHS=${ARCHS:-90a}
PYTHON=${PYTHON:-python3}
JOBS=${JOBS:-$(nproc)}
OUT_DIR=${OUT:-.}
RESULTS="$ROOT/bench/results"
mkdir -p "$OUT_DIR" "$RESULTS"

t0=$(date +%s)
cmake -S "$ROOT" -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DATTN_SERVER=OFF \
  -DATTN_TESTS=OFF -DCMAKE_CUDA_ARCHITECTURES="$ARCHS" >/dev/null
cmake --build "$BUILD_DIR" --target attn_decode_bench -j "$JOBS"
echo "[decode_bench] build took $(( $(date +%s) - t0 )) s" >&2

cmd="scripts/decode_bench.sh $*"
status=0
peer_args=()
prefill=0
for a in "$@"; do
  case "$a" in --quick|--sizes=*) peer_args+=("$a") ;; --prefill) prefill=1 ;; esac
done
if [[ "$prefill" == 1 ]]; then
  echo "[decode_bench] --prefill: no PyTorch peers" >&2
elif [[ "${SKIP_PEERS:-0}" != 1 ]] && "$PYTHON" -c "import torch; assert torch.cuda.is_available()" 2>/dev/null; then
  # Peers first so that the binary's table is the last thing printed.
  "$PYTHON" "$ROOT/bench/decode_peers.py" --json-dir="$OUT_DIR" --json-dir="$RESULTS" \
    "${peer_args[@]}" || echo "[decode_bench] decode_peers.py failed (exit $?)" >&2
else
  echo "[decode_bench] torch with CUDA not available: PyTorch peers skipped" >&2
fi
"$BUILD_DIR/bench/attn_decode_bench" --json-dir="$OUT_DIR" --json-dir="$RESULTS" \
  --command="$cmd" "$@" || status=$?
echo "[decode_bench] total $(( $(date +%s) - t0 )) s, exit $status" >&2
exit $status
