#!/usr/bin/env bash
# Many client processes against one server (issue 18 item 5): one attention-server (KV cache on
# KV_DEVICE, Unix socket), then P attention-loadgen processes started together, each decoding
# SESSIONS sequences as one group on one ExtendBatchStream (--decode-api packed-stream,
# --batches-in-flight IN_FLIGHT, --batch-sessions SESSIONS --requests SESSIONS --concurrency 1),
# shape N=HEADS K=KV_HEADS H=HEAD_DIM DTYPE, LAYERS layers, a CONTEXT-token prompt then STEPS
# decode steps. Issue 18's target: with P=8 x 64 sequences on an H200, the aggregate steady
# decode rate >= 0.7 x the kernel-only rate.
# The start is a barrier: every loadgen waits for a common file, created once all are launched.
# scripts/multiproc_summary.py then combines the P reports and the server's decode-only batch
# totals (logged at info on SIGTERM) into multiproc-summary.json (printed as a table):
#   aggregate_steady_decode_steps_per_s  sum of the processes' steady rates (each over its own
#     steady window: all its sessions decoding); common_window_s is where every process's
#     windows overlap and window_coverage its share of the mean window (an approximation: each
#     process's rate is taken as uniform over its window)
#   kernel_only_steps_per_s  steps per decode-only server batch / kernel time per batch (the
#     server log), per loadgen decode step (/ LAYERS); ratio = aggregate / kernel-only. It
#     takes batches to run one after another: where several batch threads run batches at once
#     (the cpu KV cache) the ratio can exceed 1
#   message p50/p99 (median and max over processes), server batch kernel p50, errors.
# Writes ${OUT:-out}/multiproc-<i>.{json,txt}, multiproc-server.log, multiproc-summary.json.
# No output is verified unless VERIFY_FRACTION > 0.
# Usage: OUT=out bash scripts/multiproc_bench.sh   (P=8 CONTEXT=4096 STEPS=256 SESSIONS=64
# IN_FLIGHT=2 HEADS=32 KV_HEADS=8 HEAD_DIM=128 DTYPE=bf16 LAYERS=1; RUN: a launcher taking the
# binary name first, default the bundle's .bundle/attn/run.sh; LOADGEN_RUN: the loadgen's;
# KV_DEVICE=cpu and tiny shapes for a CPU try; KV_CACHE_BYTES; SERVER_ARGS: extra server flags;
# LOADGEN_TIMEOUT (s, 240) bounds each loadgen; REGION=host: each loadgen passes its tensors
# through a leased host shared-memory region, loadgen --region). Exit 0 when every loadgen exited 0 and the
# summary was written. Wall time on an H200 at the defaults: not measured yet (expected < 1 min).
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${OUT:-$root/out}
mkdir -p "$out"
b=${RUN:-$root/.bundle/attn/run.sh}
lg=${LOADGEN_RUN:-$b}
KV_DEVICE=${KV_DEVICE:-gpu}
P=${P:-8}
CONTEXT=${CONTEXT:-4096}
STEPS=${STEPS:-256}
SESSIONS=${SESSIONS:-64}
IN_FLIGHT=${IN_FLIGHT:-2}
HEADS=${HEADS:-32}
KV_HEADS=${KV_HEADS:-8}
HEAD_DIM=${HEAD_DIM:-128}
DTYPE=${DTYPE:-bf16}
LAYERS=${LAYERS:-1}
VERIFY_FRACTION=${VERIFY_FRACTION:-0}
LOADGEN_TIMEOUT=${LOADGEN_TIMEOUT:-240}
# KV bytes the run holds: P x SESSIONS x (CONTEXT + STEPS) tokens x LAYERS x K x H x 2 (k, v)
# x dtype; the default leaves 2x that (at least 256 MiB).
item=$([ "$DTYPE" = fp32 ] && echo 4 || echo 2)
need=$((P * SESSIONS * (CONTEXT + STEPS) * LAYERS * KV_HEADS * HEAD_DIM * 2 * item))
KV_CACHE_BYTES=${KV_CACHE_BYTES:-$(( 2 * need > (256 << 20) ? 2 * need : (256 << 20) ))}
dir=$(mktemp -d)
trap 'kill "$spid" 2>/dev/null; rm -rf "$dir"' EXIT
rm -f "$out"/multiproc-*.json "$out"/multiproc-*.txt
# shellcheck disable=SC2086  # SERVER_ARGS is a list of flags
"$b" attention-server --listen "unix:$dir/attn.sock" --kv-device "$KV_DEVICE" \
  --kv-cache-bytes "$KV_CACHE_BYTES" --log-level info --metrics-address "" \
  --grpc-memory-bytes $((16 << 30)) --max-queue-requests 65536 ${SERVER_ARGS:-} \
  2>"$out/multiproc-server.log" &
spid=$!
for _ in $(seq 1 300); do [ -S "$dir/attn.sock" ] && break; sleep 0.1; done
if [ ! -S "$dir/attn.sock" ]; then
  echo "multiproc: server did not start"; tail -n 20 "$out/multiproc-server.log"; exit 1
fi
args=(--target "unix:$dir/attn.sock" --workload session --decode-api packed-stream
  --batches-in-flight "$IN_FLIGHT" --batch-sessions "$SESSIONS" --requests "$SESSIONS"
  --concurrency 1 --layers "$LAYERS" --heads "$HEADS" --kv-heads "$KV_HEADS"
  --head-dim "$HEAD_DIM" --dtype "$DTYPE" --fixed-tokens "$CONTEXT" --max-gen "$STEPS"
  --verify-fraction "$VERIFY_FRACTION" --region "${REGION:-none}" --fail-on-error --quiet)
# No --check-kv-released: each loadgen would see the sequences the others still hold.
pids=()
for i in $(seq 1 "$P"); do
  (
    while [ ! -e "$dir/go" ]; do sleep 0.005; done
    exec timeout "$LOADGEN_TIMEOUT" "$lg" attention-loadgen "${args[@]}" \
      --seed "$i" --json "$out/multiproc-$i.json" >"$out/multiproc-$i.txt" 2>&1
  ) &
  pids+=($!)
done
sleep 0.5  # every waiter is polling by now
touch "$dir/go"
rcs=()
for pid in "${pids[@]}"; do
  wait "$pid"
  rcs+=($?)
done
echo "multiproc: loadgen exits ${rcs[*]}"
kill -TERM "$spid"; wait "$spid"
echo "multiproc: server exit $?"
python3 "$root/scripts/multiproc_summary.py" --out "$out" --processes "$P" --layers "$LAYERS" \
  --server-log "$out/multiproc-server.log" --exit-codes "${rcs[*]}" ||
  { echo "multiproc: no summary"; exit 1; }
for rc in "${rcs[@]}"; do [ "$rc" -eq 0 ] || exit 1; done
