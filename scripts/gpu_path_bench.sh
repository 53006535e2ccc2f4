#!/usr/bin/env bash
# On a GPU host: the request-path benchmark of issues 17 and 18 (message latency from the
# frontend's seat beside server and kernel time). The bundled attention-server (GPU KV cache)
# and attention-loadgen (C++), N=32 K=8 H=128 bf16, one layer, 4096-token context, per transport
# (TCP loopback, Unix socket), each case REPEATS (3) times:
#   stream1   one sequence decoding through ExtendStream (message p50/p99 = write of a request to
#             read of its result), STEPS1 (1000) steps;
#   extend1   the same through unary Extend (decode step latency = one call);
#   batch64   one worker decoding 64 sequences together through ExtendBatch (one call per step
#             of all 64, a sub-message per step), STEPS64 (64) steps;
#   packed64  the same as one packed ExtendBatch per step (one q, k, v tensor; one o);
#   pstream64 the same on one ExtendBatchStream, the 64 split into 2 micro-batches in flight
#             (message = one micro-batch's write to its reply);
#   packed64h, pstream64h  packed64 and pstream64 with q, k, v and o through a leased host
#             shared-memory region (loadgen --region host; message includes the client's copies);
# plus an empty-call floor (C++ tiny Attend: one query token, one key; frontend_measure.py).
# Writes ${OUT:-out}/path-<transport>-<case>-<i>.json (the loadgen's --json), their server logs
# and path-summary.json: per case the median over the repeats of message p50/p99, server
# time p50 and the batch kernel time p50 (ms). No output is verified (--verify-fraction 0):
# scripts/gpu_sessions_check.sh verifies the same path against float64.
# Usage: OUT=out bash scripts/gpu_path_bench.sh   (TRANSPORTS="tcp unix" CASES="stream1 extend1
# batch64" REPEATS=3; RUN and KV_DEVICE=cpu for a CPU try; SERVER_ARGS: extra server flags, e.g.
# "--kv-cuda-graphs off"). Wall time on an H200: ~2-3 min.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${OUT:-$root/out}
mkdir -p "$out"
b=${RUN:-$root/.bundle/attn/run.sh}  # RUN: a launcher taking the binary name first
lg=${LOADGEN_RUN:-$b}  # LOADGEN_RUN: the loadgen's launcher (compare: one loadgen, two servers)
KV_DEVICE=${KV_DEVICE:-gpu}
REPEATS=${REPEATS:-3}
STEPS1=${STEPS1:-1000}
STEPS64=${STEPS64:-64}
TRANSPORTS=${TRANSPORTS:-tcp unix}
CASES=${CASES:-stream1 extend1 batch64 packed64 pstream64}
shape=(--layers 1 --heads 32 --kv-heads 8 --head-dim 128 --dtype bf16 --fixed-tokens 4096
  --verify-fraction 0 --check-kv-released --fail-on-error --quiet)
for transport in $TRANSPORTS; do
  dir=$(mktemp -d)
  if [ "$transport" = unix ]; then listen="unix:$dir/attn.sock"; else listen=127.0.0.1:0; fi
  # shellcheck disable=SC2086  # SERVER_ARGS is a list of flags
  "$b" attention-server --listen "$listen" --port-file "$dir/port" --kv-device "$KV_DEVICE" \
    --kv-cache-bytes $((8 << 30)) --log-level info --max-queue-requests 4096 ${SERVER_ARGS:-} \
    2>"$out/path-$transport-server.log" &
  pid=$!
  for _ in $(seq 1 300); do [ -s "$dir/port" ] || [ -S "$dir/attn.sock" ] && break; sleep 0.1; done
  if [ "$transport" = unix ]; then target=$listen; else target="127.0.0.1:$(cat "$dir/port")"; fi
  # The floor: 200 tiny Attends (1 query token, 1 key), closed loop, one connection.
  "$lg" attention-loadgen --target "$target" --workload fixed --fixed-tokens 1 --heads 1 \
    --kv-heads 1 --head-dim 64 --dtype fp32 --requests 200 --concurrency 1 --quiet \
    --json "$out/path-$transport-floor.json" >/dev/null 2>&1 ||
    echo "path $transport floor: loadgen exit $?"
  for case in $CASES; do
    for i in $(seq 1 "$REPEATS"); do
      case $case in
        stream1) args=(--decode-api stream --requests 1 --concurrency 1 --max-gen "$STEPS1") ;;
        extend1) args=(--decode-api extend --requests 1 --concurrency 1 --max-gen "$STEPS1") ;;
        batch64) args=(--decode-api batch --batch-sessions 64 --requests 64 --concurrency 1
          --max-gen "$STEPS64") ;;
        packed64) args=(--decode-api packed --batch-sessions 64 --requests 64 --concurrency 1
          --max-gen "$STEPS64") ;;
        pstream64) args=(--decode-api packed-stream --batches-in-flight 2 --batch-sessions 64
          --requests 64 --concurrency 1 --max-gen "$STEPS64") ;;
        packed64h) args=(--decode-api packed --batch-sessions 64 --requests 64 --concurrency 1
          --max-gen "$STEPS64" --region host) ;;
        pstream64h) args=(--decode-api packed-stream --batches-in-flight 2 --batch-sessions 64
          --requests 64 --concurrency 1 --max-gen "$STEPS64" --region host) ;;
      esac
      timeout 120 "$lg" attention-loadgen --target "$target" --workload session "${shape[@]}" \
        "${args[@]}" --json "$out/path-$transport-$case-$i.json" \
        >"$out/path-$transport-$case-$i.txt" 2>&1
      echo "path $transport $case $i: loadgen exit $?"
    done
  done
  kill -TERM "$pid"; wait "$pid"
  echo "path $transport: server exit $?"
done
python3 - "$out" "$REPEATS" <<'PY'
import json, os, statistics, sys
out, reps = sys.argv[1], int(sys.argv[2])
def get(j, key, q):
    v = j.get(key) or {}
    return v.get(q)
summary = {}
for name in sorted(os.listdir(out)):
    if not (name.startswith("path-") and name.endswith("-1.json")):
        continue
    stem = name[: -len("-1.json")]
    runs = []
    for i in range(1, reps + 1):
        try:
            runs.append(json.load(open(os.path.join(out, f"{stem}-{i}.json"))))
        except Exception:
            pass
    if not runs:
        continue
    # stream1 and the packed cases time each message/call; extend1 and batch64 one call per step
    # (one layer), their decode step latency.
    msg_key = ("stream_message_latency_ms" if "stream1" in stem else
               "message_latency_ms" if ("packed64" in stem or "pstream64" in stem) else
               "decode_step_latency_ms")
    row = {"runs": len(runs)}
    for label, key, q in (("message_p50_ms", msg_key, "p50"), ("message_p99_ms", msg_key, "p99"),
                          ("server_total_p50_ms", "server_total_ms", "p50"),
                          ("server_batch_p50_ms", "server_batch_ms", "p50"),
                          ("kernel_p50_ms", "server_batch_kernel_ms", "p50")):
        vals = [x for x in (get(r, key, q) for r in runs) if x is not None]
        row[label] = statistics.median(vals) if vals else None
        row[label + "_runs"] = vals
    summary[stem[len("path-"):]] = row
for t in ("tcp", "unix"):
    try:
        f = json.load(open(os.path.join(out, f"path-{t}-floor.json")))
        summary[f"{t}-floor"] = {"message_p50_ms": get(f, "latency_ms", "p50"),
                                 "message_p99_ms": get(f, "latency_ms", "p99")}
    except Exception:
        pass
json.dump(summary, open(os.path.join(out, "path-summary.json"), "w"), indent=1)
print(f"{'case':18} {'msg p50':>8} {'msg p99':>8} {'srv p50':>8} {'batch':>8} {'kernel':>8}  ms")
fmt = lambda x: f"{x:8.3f}" if isinstance(x, (int, float)) else f"{'-':>8}"
for k, r in summary.items():
    print(f"{k:18} {fmt(r.get('message_p50_ms'))} {fmt(r.get('message_p99_ms'))} "
          f"{fmt(r.get('server_total_p50_ms'))} {fmt(r.get('server_batch_p50_ms'))} "
          f"{fmt(r.get('kernel_p50_ms'))}")
PY
