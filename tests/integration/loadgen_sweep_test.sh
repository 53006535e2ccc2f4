#!/usr/bin/env bash
# Integration: `attention-loadgen sweep` against a real server (cpu backend, tiny shapes) prints
# the table and writes sweep-<kind>.csv with one row per (point, backend) and a valid PNG; the
# plot script's tick labels and failed-point handling.
# Skipped (exit 77) when python3 cannot import matplotlib.
set -euo pipefail
server=$1
loadgen=$2
python3 -c 'import matplotlib' 2>/dev/null || { echo "SKIP: matplotlib not installed"; exit 77; }
dir=$(mktemp -d)
trap 'kill $pid 2>/dev/null || true; rm -rf "$dir"' EXIT
"$server" --listen 127.0.0.1:0 --port-file "$dir/port" --log-level warn --metrics-address "" \
  2>"$dir/server.log" &
pid=$!
for _ in $(seq 1 300); do [ -s "$dir/port" ] && break; sleep 0.1; done
target="127.0.0.1:$(cat "$dir/port")"
check() {  # kind expected-rows
  local csv="$dir/out/sweep-$1.csv" png="$dir/out/sweep-$1.png"
  [ "$(tail -n +2 "$csv" | wc -l)" -eq "$2" ] || { echo "bad row count in $csv"; cat "$csv"; exit 1; }
  [ "$(head -c 8 "$png" | od -An -tx1 | tr -d ' \n')" = "89504e470d0a1a0a" ] ||
    { echo "$png is not a PNG"; exit 1; }
}
"$loadgen" sweep --target "$target" --backends cpu --sweep seq --seq 16,32,64 --heads 4 \
  --kv-heads 4 --head-dim 32 --requests 4 --quiet --out "$dir/out" | tee "$dir/seq.txt"
grep -qE '^seq +backend +p50 ms +p99 ms +req/s +TFLOP/s' "$dir/seq.txt"
for t in 16 32 64; do grep -qE "^T=$t +cpu " "$dir/seq.txt"; done
grep -q '^seq,T=32,cpu,1,32,4,4,32,bf16,4,4,0,' "$dir/out/sweep-seq.csv"
head -1 "$dir/out/sweep-seq.csv" | grep -q ',tflops,error$'
check seq 3
"$loadgen" sweep --target "$target" --backends cpu --sweep heads --heads 8 --tokens 32 \
  --head-dim 32 --requests 3 --quiet --out "$dir/out" | tee "$dir/heads.txt"
for p in "MHA K=8" "GQA K=2" "MQA K=1"; do grep -q "^$p .*cpu" "$dir/heads.txt"; done
check heads 3
"$loadgen" sweep --target "$target" --backends cpu --sweep batch --batches 1,2 --tokens 16 \
  --heads 2 --kv-heads 2 --head-dim 16 --requests 2 --quiet --out "$dir/out"
check batch 2
# Without a usable python the CSV is still written; --plot=optional keeps exit status 0.
rm -rf "$dir/out2"
"$loadgen" sweep --target "$target" --sweep batch --batches 1 --tokens 8 --heads 2 --kv-heads 2 \
  --head-dim 8 --requests 1 --quiet --out "$dir/out2" --python /nonexistent/python --plot optional
[ -s "$dir/out2/sweep-batch.csv" ] && [ ! -e "$dir/out2/sweep-batch.png" ]
rc=0
"$loadgen" sweep --target "$target" --sweep batch --batches 1 --tokens 8 --heads 2 --kv-heads 2 \
  --head-dim 8 --requests 1 --quiet --out "$dir/out2" --python /nonexistent/python || rc=$?
[ "$rc" -ne 0 ] || { echo "--plot required without python should fail"; exit 1; }
# plot_sweep.py: plain tick labels (never 4x10^1), failed (empty) cells read as NaN, not 0, and a
# CSV with a failed point still plots (with a title, as the loadgen passes the run's context).
script="$(dirname "$0")/../../client/loadgen/plot_sweep.py"
python3 - "$script" <<'PY'
import importlib.util, math, sys
spec = importlib.util.spec_from_file_location("plot_sweep", sys.argv[1])
m = importlib.util.module_from_spec(spec)
spec.loader.exec_module(m)
assert m.plain(40.0) == "40" and m.plain(0.5) == "0.5" and m.plain(1200.0) == "1200"
assert math.isnan(m.number("")) and m.number("2.5") == 2.5
class Ax:
    def get_ylim(self): return (35.0, 60.0)
assert m.plain_minor(Ax())(40.0) == "40"  # within a decade every minor tick is labelled
PY
{ head -1 "$dir/out/sweep-seq.csv"; echo 'seq,T=8,cpu,1,8,4,4,32,bf16,4,0,4,,,,,,"X: y"';
  tail -n +2 "$dir/out/sweep-seq.csv"; } > "$dir/failed.csv"
python3 "$script" "$dir/failed.csv" "$dir/failed.png" seq "title with context"
[ "$(head -c 8 "$dir/failed.png" | od -An -tx1 | tr -d ' \n')" = "89504e470d0a1a0a" ]
echo PASS
