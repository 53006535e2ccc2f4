#!/usr/bin/env bash
# The main job: install what is missing, build, start attention-server on its embedded default
# (127.0.0.1:50051, backend auto), replay the first 200 requests of the Azure LLM inference
# 2023 conversation trace with attention-loadgen (token scale 0.5, 20% of responses checked by
# the float64 oracle), print the report, and stop the server with SIGTERM.
# Exit status: 0 when the replay had no errors and no oracle mismatches and the server stopped
# cleanly. Extra arguments are passed to attention-loadgen (e.g. --requests 50).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/bootstrap.sh" --run  # only what building and running needs; test.sh adds the rest
# Say what the build will contain before the long, quiet compile (CUDA is on whenever nvcc is
# found, GPU or not: the same binary then serves the GPU backends on a machine that has one).
# (a failing configure is reported by the build below, with its log)
{ "$root/scripts/build.sh" --no-tests --configure-only | grep -E "^-- attn:" |
    sed 's/^/[run] /'; } || true
echo "[run] building attention-server and attention-loadgen (on 2 cores: a few minutes without"
echo "[run] CUDA; with CUDA on (nvcc found, even without a GPU) ~12 minutes; log: build.log)"
"$root/scripts/build.sh" --no-tests --target attention-server --target attention-loadgen \
  >"$root/build.log" 2>&1 || { tail -50 "$root/build.log"; exit 1; }
bin="$root/build"
log=$(mktemp)
"$bin/server/attention-server" 2>"$log" &
pid=$!
cleanup() { kill "$pid" 2>/dev/null || true; }
trap cleanup EXIT
for _ in $(seq 1 100); do
  grep -q "serving on" "$log" && break
  if ! kill -0 "$pid" 2>/dev/null; then cat "$log"; exit 1; fi
  sleep 0.1
done
sed 's/^/[server] /' "$log"
status=0
# The defaults below, each unless the caller gave that flag (the loadgen takes a flag once).
defaults=()
for kv in --requests=200 --concurrency=2 --token-scale=0.5 --verify-fraction=0.2; do
  flag=${kv%%=*}
  given=0
  for a in "$@"; do case "$a" in "$flag" | "$flag"=*) given=1 ;; esac; done
  [ "$given" = 1 ] || defaults+=("$flag" "${kv#*=}")
done
"$bin/client/attention-loadgen" "${defaults[@]}" --fail-on-error "$@" || status=$?
kill -TERM "$pid"
wait "$pid" && server_rc=0 || server_rc=$?
tail -n 2 "$log" | sed 's/^/[server] /'
trap - EXIT
echo "loadgen exit $status; server exit $server_rc"
[ "$status" -eq 0 ] && [ "$server_rc" -eq 0 ]
