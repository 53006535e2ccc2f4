#!/usr/bin/env bash
# On a GPU host (DESIGN.md §11): the bundled attention-server with its KV cache on the GPU
# (--kv-device gpu: pages in device memory, paged append + split-KV decode kernels) driven by
# the bundled attention-loadgen's generation sessions (prefill, then decode through Extend,
# ExtendBatch and ExtendStream; bf16 and fp16; GQA N=32/K=8 H=128 and N=K=8 H=64) and a
# Mooncake replay with prefix forks, every output checked against the float64 oracle
# (--verify-fraction 1), KV pages back to 0 at the end (--check-kv-released).
# Writes ${OUT:-out}/sessions-*.{txt,json} and the server log. Exit 0 only when all pass.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${OUT:-$root/out}
mkdir -p "$out"
b="$root/.bundle/attn/run.sh"
dir=$(mktemp -d)
"$b" attention-server --listen 127.0.0.1:0 --port-file "$dir/port" --kv-device gpu \
  --kv-cache-bytes $((8 << 30)) --default-backend fused --log-level warn \
  2>"$out/sessions-server.log" &
pid=$!
for _ in $(seq 1 300); do [ -s "$dir/port" ] && break; sleep 0.1; done
if [ ! -s "$dir/port" ]; then echo "server did not start"; cat "$out/sessions-server.log"; exit 1; fi
target="127.0.0.1:$(cat "$dir/port")"
fail=0
run() {  # name args...
  local name=$1; shift
  "$b" attention-loadgen --target "$target" --verify-fraction 1 --quiet --check-kv-released \
    --fail-on-error --json "$out/sessions-$name.json" "$@" >"$out/sessions-$name.txt" 2>&1
  local rc=$?
  echo "sessions $name: exit $rc; $(grep -E 'verified|mismatch' "$out/sessions-$name.txt" | head -2 | tr '\n' ' ')"
  [ $rc -eq 0 ] || { fail=1; tail -n 15 "$out/sessions-$name.txt"; }
}
for api in extend batch stream; do
  run "$api-bf16-h128" --workload session --decode-api "$api" --requests 8 --concurrency 4 \
    --batch-sessions 4 --layers 2 --heads 32 --kv-heads 8 --head-dim 128 --dtype bf16 \
    --token-scale 0.5 --max-gen 8
done
run "stream-fp16-h64" --workload session --decode-api stream --requests 8 --concurrency 4 \
  --layers 2 --heads 8 --kv-heads 8 --head-dim 64 --dtype fp16 --token-scale 0.5 --max-gen 8
run "mooncake-bf16" --workload mooncake --requests 16 --concurrency 4 --layers 1 --heads 16 \
  --kv-heads 4 --head-dim 128 --dtype bf16 --token-scale 0.05 --max-gen 4 \
  --prefix-cache-sequences 4
kill -TERM "$pid"; wait "$pid"; src=$?
tail -n 3 "$out/sessions-server.log"
echo "sessions check: server exit $src, failures $fail"
[ "$fail" -eq 0 ] && [ "$src" -eq 0 ]
