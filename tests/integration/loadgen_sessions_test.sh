#!/usr/bin/env bash
# Integration: attention-loadgen's SequenceService workloads against a real server (cpu, tiny
# shapes): generation sessions decoded through Extend, ExtendBatch and ExtendStream, and a
# Mooncake replay with prefix forks and a small LRU (evictions). Each run verifies every output
# against the float64 oracle and ends with --check-kv-released (0 KV pages used, 0 live
# sequences); the last runs meet the server's --max-connection-age-s GOAWAYs.
set -euo pipefail
server=$1
loadgen=$2
dir=$(mktemp -d)
trap 'kill $pid 2>/dev/null || true; rm -rf "$dir"' EXIT
"$server" --listen 127.0.0.1:0 --port-file "$dir/port" --log-level warn --metrics-address "" \
  2>"$dir/server.log" &
pid=$!
for _ in $(seq 1 300); do [ -s "$dir/port" ] && break; sleep 0.1; done
target="127.0.0.1:$(cat "$dir/port")"
common=(--target "$target" --layers 2 --heads 4 --kv-heads 2 --head-dim 16 --verify-fraction 1
        --quiet --check-kv-released --fail-on-error)
# api:region — the packed APIs also with q, k, v and o through a leased host shared-memory
# region (--region host): the same verified outputs, and the region released at the end.
for variant in extend batch stream packed packed-stream packed:host packed-stream:host; do
  api=${variant%%:*}
  region=none
  [ "$api" = "$variant" ] || region=${variant#*:}
  name=$api-$region
  "$loadgen" "${common[@]}" --workload session --decode-api "$api" --requests 6 --concurrency 2 \
    --batch-sessions 3 --batches-in-flight 2 --dtype fp32 --token-scale 0.02 --max-gen 4 \
    --region "$region" --json "$dir/$name.json" | tee "$dir/$name.txt"
  python3 - "$dir/$name.json" "$region" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
assert j["region"] == sys.argv[2], j
assert j["sessions"] == 6 and j["sessions_ok"] == 6, j
assert not j["errors"] and j["mismatches"] == 0 and j["verified"] > 0, j
assert j["decode_steps"] > 0 and j["decode_step_latency_ms"]["count"] == j["decode_steps"], j
assert j["kv_pages_used_after"] == 0, j
# The server_* summaries are of decode steps only: per step and layer for the per-step APIs,
# once per packed call for the packed ones; the prefills' reports (one per layer and session,
# unary Extend) are apart in prefill_server_total_ms.
assert j["server_batch_size"]["p50"] >= 1 and j["server_queue_ms"]["count"] > 0, j
assert j["prefill_server_total_ms"]["count"] == 6 * 2, j
if not j["decode_api"].startswith("packed"):
    assert j["server_total_ms"]["count"] == 2 * j["decode_steps"], j
if j["decode_api"] == "stream":
    assert j["stream_message_latency_ms"]["count"] == 2 * j["decode_steps"], j
# Packed calls and packed-stream messages are timed one by one (write -> reply), one per layer
# and (micro-)batch; the packed batch's one report is recorded once per call.
if j["decode_api"].startswith("packed"):
    assert j["message_latency_ms"]["count"] >= 2, j
    assert j["server_total_ms"]["count"] == j["message_latency_ms"]["count"], j
if j["decode_api"] == "packed-stream":
    assert j["batches_in_flight"] == 2, j
PY
done
# Every region the loadgen created was unlinked when its group ended.
if ls /dev/shm/attn_loadgen_* >/dev/null 2>&1; then
  echo "loadgen left shared-memory objects behind:"; ls /dev/shm/attn_loadgen_*; exit 1
fi
"$loadgen" "${common[@]}" --workload mooncake --requests 16 --concurrency 2 --dtype bf16 \
  --token-scale 0.01 --max-gen 2 --prefix-cache-sequences 3 --json "$dir/mc.json" \
  --csv "$dir/mc.csv" | tee "$dir/mc.txt"
python3 - "$dir/mc.json" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
assert j["sessions_ok"] == 16 and not j["errors"] and j["mismatches"] == 0, j
assert j["forks"] > 0 and j["tokens_saved"] > 0 and j["prefix_evictions"] > 0, j
assert j["kv_pages_used_after"] == 0, j
PY
[ "$(wc -l <"$dir/mc.csv")" -eq 2 ] && head -1 "$dir/mc.csv" | grep -q '^workload,decode_api,'
# Overload: a second server with a 2-slot queue and one worker refuses much of 32 concurrent
# sessions (RESOURCE_EXHAUSTED), but never a ReleaseSequence (it runs on the gRPC thread when
# the queue is full), so every sequence that was created is released: 0 pages, 0 sequences.
kill "$pid"; wait "$pid" 2>/dev/null || true
rm -f "$dir/port"
"$server" --listen 127.0.0.1:0 --port-file "$dir/port" --log-level warn --metrics-address "" \
  --threads 1 --max-queue-requests 2 2>"$dir/server2.log" &
pid=$!
for _ in $(seq 1 300); do [ -s "$dir/port" ] && break; sleep 0.1; done
"$loadgen" --target "127.0.0.1:$(cat "$dir/port")" --layers 1 --heads 4 --kv-heads 2 \
  --head-dim 16 --verify-fraction 0 --quiet --workload session --decode-api stream \
  --requests 96 --concurrency 32 --dtype fp32 --fixed-tokens 8 --max-gen 8 \
  --check-kv-released --json "$dir/overload.json" >"$dir/overload.txt" || true
python3 - "$dir/overload.json" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
assert j["errors"].get("RESOURCE_EXHAUSTED", 0) > 0, j  # the overload really happened
assert j["kv_pages_used_after"] == 0, j
PY
# Connection age (issue 19): a server that GOAWAYs every connection after 0.2 s (grace 0.05 s,
# so a stream still open then ends UNAVAILABLE): every sequence is released in the end, through
# reconnects (ReleaseSequence retried on UNAVAILABLE, release_retry.h): 0 live sequences,
# 0 pages, no release left failed. Session errors are allowed (a stream cut at the grace).
kill "$pid"; wait "$pid" 2>/dev/null || true
rm -f "$dir/port"
"$server" --listen 127.0.0.1:0 --port-file "$dir/port" --log-level warn --metrics-address "" \
  --max-connection-age-s 0.2 --max-connection-age-grace-s 0.05 2>"$dir/server3.log" &
pid=$!
for _ in $(seq 1 300); do [ -s "$dir/port" ] && break; sleep 0.1; done
for api in stream extend; do
  "$loadgen" --target "127.0.0.1:$(cat "$dir/port")" --layers 2 --heads 4 --kv-heads 2 \
    --head-dim 16 --verify-fraction 0 --quiet --workload session --decode-api "$api" \
    --requests 40 --concurrency 4 --dtype fp32 --token-scale 0.02 --max-gen 32 \
    --check-kv-released --json "$dir/age_$api.json" >"$dir/age_$api.txt" || true
  python3 - "$dir/age_$api.json" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
assert j["sessions"] == 40, j
assert j["sequences_after"] == 0 and j["kv_pages_used_after"] == 0, j
assert j["releases_failed"] == 0 and "ReleaseSequence" not in str(j["first_error_messages"]), j
PY
done
echo PASS
