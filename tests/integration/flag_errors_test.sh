#!/usr/bin/env bash
# Flag errors of both binaries exit 2 (what README and docs/loadgen.md say; CLI11's own codes
# were 105/109) with CLI11's message on stderr; --help and --version exit 0; both binaries'
# range messages are readable ("--rate: must be > 0, got 0", "--sequence-ttl-s: must be in
# [0, 1000000000], got -1", never DBL_MAX or "0.000000"); the server's listen addresses are
# checked before anything starts (`--listen nothost:50051` exits 2 at once, nothing logged
# about backends or the KV cache).
# Usage: flag_errors_test.sh ATTENTION_SERVER ATTENTION_LOADGEN. Nothing listens: every case
# stops at parsing or at the listen-address check (each bounded by `timeout 20`).
set -u
server=$1
loadgen=$2
failures=0
out=$(mktemp)
trap 'rm -f "$out"' EXIT

# expect RC PATTERN CMD...: runs CMD, checks its exit status is RC and that its output (stdout
# and stderr) contains PATTERN (fixed string; empty: no check).
expect() {
  local want=$1 pattern=$2
  shift 2
  timeout 20 "$@" >"$out" 2>&1
  local rc=$?
  if [[ $rc -ne $want ]]; then
    echo "FAIL: $* exited $rc, want $want:"; head -5 "$out"; failures=$((failures + 1))
  elif [[ -n $pattern ]] && ! grep -qF -- "$pattern" "$out"; then
    echo "FAIL: $* output lacks '$pattern':"; head -5 "$out"; failures=$((failures + 1))
  elif grep -qE '1797693|0\.000000' "$out"; then
    echo "FAIL: $* prints DBL_MAX or 0.000000:"; head -5 "$out"; failures=$((failures + 1))
  else
    echo "ok: $* -> $rc"
  fi
}

# attention-server (ParseServerFlags).
expect 2 "The following argument was not expected: --no-such-flag" "$server" --no-such-flag
expect 2 "Run with --help for more information." "$server" --no-such-flag
expect 2 "--kv-cache-bytes" "$server" --kv-cache-bytes 12
expect 2 "environment variable ATTN_KV_CACHE_BYTES=12" env ATTN_KV_CACHE_BYTES=12 "$server"
expect 2 "--log-format" "$server" --log-format yaml
expect 0 "Usage:" "$server" --help
# Range errors in the loadgen's readable form (CLI::Range printed "0.000000 to 1000000000.000000").
expect 2 "--sequence-ttl-s: must be in [0, 1000000000], got -1" "$server" --sequence-ttl-s -1
expect 2 "--drain-timeout-s: must be in [0, 3600], got -1" "$server" --drain-timeout-s -1
expect 2 "--gpu-memory-fraction: must be in [0.01, 1], got 2" "$server" --gpu-memory-fraction 2
expect 2 "--max-connection-age-s: must be in [0, 2592000], got -5" "$server" \
  --max-connection-age-s -5
expect 2 "--threads: must be in [0, 1024], got 5000" "$server" --threads 5000
expect 2 "--threads: must be an integer in [0, 1024], got abc" "$server" --threads abc
expect 2 "--kv-cache-bytes: must be in [65536, 17592186044416], got 12" "$server" \
  --kv-cache-bytes 12
expect 2 "--drain-timeout-s: must be a finite number, got nan" "$server" --drain-timeout-s nan
expect 2 "environment variable ATTN_SEQUENCE_TTL_S=-1 (for --sequence-ttl-s): --sequence-ttl-s: \
must be in [0, 1000000000], got -1" env ATTN_SEQUENCE_TTL_S=-1 "$server"
# Listen and metrics addresses: refused before the backends, the KV cache or metrics start (no
# such log line), exit 2.
expect 2 '--listen: host "nothost" does not resolve' "$server" --listen nothost:50051
expect_quiet_start() {
  # ("metrics: http..." or "metrics are not served", not the --metrics-address error itself)
  if grep -qiE 'backend|kv cache|kv_cache|metrics: |metrics are not' "$out"; then
    echo "FAIL: $1 started something first:"; head -5 "$out"; failures=$((failures + 1))
  fi
}
expect_quiet_start "--listen nothost:50051"
expect 2 "--listen: expected host:port or unix:PATH with port in [0, 65535]" "$server" \
  --listen 127.0.0.1:99999
expect 2 "--listen: expected host:port or unix:PATH with port in [0, 65535]" "$server" \
  --listen localhost
expect 2 "--listen: expected unix:PATH with a non-empty PATH" "$server" --listen unix:
expect 2 "--listen: expected host:port or unix:PATH with port in [0, 65535]" "$server" \
  --listen :50051
expect 2 '--health-address: host "nothost" does not resolve' "$server" --listen 127.0.0.1:0 \
  --health-address nothost:8081
expect 2 "--health-address: expected host:port (no unix: socket)" "$server" \
  --listen 127.0.0.1:0 --health-address unix:/tmp/h.sock
expect 2 'environment variable ATTN_LISTEN=nothost:1 (for --listen): --listen: host "nothost"' \
  env ATTN_LISTEN=nothost:1 "$server"
# A variable no flag reads is a warning (the prefix is shared with the scripts' variables),
# with the nearest flag variable; the bad --listen only makes the server exit right after it.
expect 2 "environment variable ATTN_KV_CACHE_BYTE is not the variable of any flag: ignored \
(did you mean ATTN_KV_CACHE_BYTES?)" env ATTN_KV_CACHE_BYTE=1G "$server" --listen nothost:1
expect 2 '--metrics-address: host "nothost" does not resolve' "$server" \
  --listen 127.0.0.1:0 --metrics-address nothost:9090
expect_quiet_start "--metrics-address nothost:9090"
expect 2 "environment variable ATTN_METRICS_ADDRESS=0.0.0.0:x (for --metrics-address): \
--metrics-address: port must be in [0, 65535]" env ATTN_METRICS_ADDRESS=0.0.0.0:x \
  "$server" --listen 127.0.0.1:0

# attention-loadgen (ParseLoadgenFlags), main command and sweep subcommand.
expect 2 "The following argument was not expected: --no-such-flag" "$loadgen" --no-such-flag
expect 2 "--rate: must be > 0, got 0" "$loadgen" --rate 0
expect 2 "--token-scale: must be > 0, got 0" "$loadgen" --token-scale 0
expect 2 "--duration: must be >= 0, got -1" "$loadgen" --duration -1
expect 2 "--concurrency: must be in [1, 4096], got 0" "$loadgen" --concurrency 0
expect 2 "--verify-fraction: must be in [0, 1], got 2" "$loadgen" --verify-fraction 2
expect 2 "--concurrency: must be an integer in [1, 4096], got 1.5" "$loadgen" --concurrency 1.5
expect 2 "--requests: must be a number >= 0, got abc" "$loadgen" --requests abc
expect 2 "--rate: must be a finite number, got inf" "$loadgen" --rate inf
expect 2 "--mode: bogus not in {closed,open}" "$loadgen" --mode bogus
expect 2 "--tokens: must be > 0, got 0" "$loadgen" sweep --sweep seq --tokens 0
expect 2 "--sweep is required" "$loadgen" sweep
expect 0 "Usage:" "$loadgen" --help
expect 0 "Usage: attention-loadgen sweep" "$loadgen" sweep --help
expect 0 "" "$loadgen" --version

if [[ $failures -ne 0 ]]; then
  echo "$failures case(s) failed"
  exit 1
fi
echo "all flag-error cases passed"
