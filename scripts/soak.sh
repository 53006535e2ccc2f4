#!/usr/bin/env bash
# Soak test (tests/soak/soak.py): mixed load (valid and bad Attend calls, tiny deadlines,
# cancellations, whole sequence lifecycles with forks, truncation, streams cancelled mid-way)
# against the real server on loopback, then: no crash, still serving correctly, KV pages back to
# their starting count, resident memory at the end <= after warm-up + 64 MiB, clean SIGTERM.
# Usage: scripts/soak.sh [seconds (default 300)] [extra soak.py flags, e.g. --workers 6]
#   ATTN_SERVER_BIN: the server binary (default build/server/attention-server; build it first
#   with scripts/build.sh). The JSON report goes to build/soak-report.json unless --report.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
seconds=${1:-300}
shift || true
export ATTN_SERVER_BIN=${ATTN_SERVER_BIN:-$root/build/server/attention-server}
[ -x "$ATTN_SERVER_BIN" ] || { echo "soak: $ATTN_SERVER_BIN not found (run scripts/build.sh)" >&2; exit 1; }
report=()
case " $* " in *" --report "*) ;; *) report=(--report "$(dirname "$(dirname "$ATTN_SERVER_BIN")")/soak-report.json") ;; esac
exec "${PYTHON:-python3}" "$root/tests/soak/soak.py" --duration "$seconds" "${report[@]}" "$@"
