#!/usr/bin/env bash
# On a GPU host (DESIGN.md §11): runs the bundled attention-server (scripts/bundle.sh) with
# the given default backend and replays the first 200 Azure conversation-trace requests with
# the bundled attention-loadgen, 20% verified by its float64 oracle. Writes the report to
# ${OUT:-out}/serve-<backend>.{txt,json} and the server log beside it.
# Usage: scripts/gpu_serve_check.sh [BACKEND] [extra loadgen args]
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
backend=${1:-naive}; shift || true
out=${OUT:-$root/out}
mkdir -p "$out"
b="$root/.bundle/attn/run.sh"
dir=$(mktemp -d)
"$b" attention-server --listen 127.0.0.1:0 --port-file "$dir/port" --default-backend "$backend" \
  2>"$out/serve-$backend-server.log" &
pid=$!
for _ in $(seq 1 300); do [ -s "$dir/port" ] && break; sleep 0.1; done
if [ ! -s "$dir/port" ]; then echo "server did not start"; cat "$out/serve-$backend-server.log"; exit 1; fi
"$b" attention-loadgen --target "127.0.0.1:$(cat "$dir/port")" \
  --trace "$root/client/data/AzureLLMInferenceTrace_conv.csv" --requests 200 --concurrency 2 \
  --token-scale 0.5 --verify-fraction 0.2 --backend "$backend" --fail-on-error \
  --json "$out/serve-$backend.json" "$@" | tee "$out/serve-$backend.txt"
rc=${PIPESTATUS[0]}
kill -TERM "$pid"; wait "$pid"; src=$?
tail -n 3 "$out/serve-$backend-server.log"
echo "serve check ($backend): loadgen exit $rc, server exit $src"
[ "$rc" -eq 0 ] && [ "$src" -eq 0 ]
