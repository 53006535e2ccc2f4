#!/usr/bin/env bash
# On a GPU host (issue 4, DESIGN.md §5, §11): the bundled attention-server calibrates `auto`
# (--calibrate: every supported backend timed on the shape grid, parity checked, fastest per
# bucket; table written to $OUT/calibration.json), then bench/auto_vs_fastest.py times `auto`
# against every named GPU backend on held-out shapes from the Azure trace (not grid points).
# Start-up (calibration + cuDNN graph warm-up) is timed separately from the requests.
# Env: SHAPES (default 24), TOKEN_SCALE (default 1.0), PYTHON (default python3).
# Writes ${OUT:-out}/auto-*.txt, calibration.json and the server log.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${OUT:-$root/out}
mkdir -p "$out"
b="$root/.bundle/attn/run.sh"
py=${PYTHON:-python3}
dir=$(mktemp -d)
t0=$(date +%s%N)
"$b" attention-server --listen 127.0.0.1:0 --port-file "$dir/port" --log-level info \
  --calibrate --calibration-file "$out/calibration.json" 2>"$out/auto-server.log" &
pid=$!
for _ in $(seq 1 2400); do [ -s "$dir/port" ] && break; sleep 0.1; done
if [ ! -s "$dir/port" ]; then echo "server did not start"; tail -n 20 "$out/auto-server.log"; exit 1; fi
echo "auto: server ready (calibration + warm-up) after $(( ($(date +%s%N) - t0) / 1000000 )) ms"
target="127.0.0.1:$(cat "$dir/port")"
for h in 64 128; do
  "$py" "$root/bench/auto_vs_fastest.py" --target "$target" --shapes "${SHAPES:-24}" \
    --token-scale "${TOKEN_SCALE:-1.0}" --head-dim "$h" --heads 16 --kv-heads 4 \
    >"$out/auto-h$h.txt" 2>&1
  echo "auto h$h: exit $?"; tail -n 30 "$out/auto-h$h.txt"
done
grep -iE "calibrat|graph|warm" "$out/auto-server.log" | tail -n 20
kill -TERM "$pid"; wait "$pid"
echo "auto: server exit $?"
