#!/usr/bin/env bash
# Integration: attention-server on a free loopback port, attention-loadgen replaying the first
# 30 rows of the Azure conversation trace with every response checked by its float64 oracle.
# Passes when the replay has 0 errors and 0 mismatches and the server stops cleanly on SIGTERM.
set -euo pipefail
server=$1
loadgen=$2
dir=$(mktemp -d)
trap 'kill $pid 2>/dev/null || true; rm -rf "$dir"' EXIT
"$server" --listen 127.0.0.1:0 --port-file "$dir/port" --log-level warn 2>"$dir/server.log" &
pid=$!
for _ in $(seq 1 300); do [ -s "$dir/port" ] && break; sleep 0.1; done
port=$(cat "$dir/port")
"$loadgen" --target "127.0.0.1:$port" --requests 30 --concurrency 2 --token-scale 0.05 \
  --verify-fraction 1 --fail-on-error --json "$dir/report.json" | tee "$dir/report.txt"
grep -q '"mismatches": *0' "$dir/report.json" || { echo "oracle mismatches"; exit 1; }
kill -TERM $pid
wait $pid
echo "server exit: $?"
