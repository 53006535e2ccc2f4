#!/usr/bin/env bash
# Integration: attention-loadgen's --tolerance against a real server (cpu, bf16, tiny shapes),
# on the Attend path (fixed workload) and the SequenceService path (session workload, prefill by
# Extend and decode by packed-stream). Each path runs three times on the same seed: by the dtype
# (tolerance 1e-2, passes), with --tolerance half the worst relative error of that run (the same
# outputs now fail: mismatches > 0, exit 1 under --fail-on-error) and with 4x it (passes). The
# report prints the tolerance used ("tol ...") and the JSON carries it.
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
shape=(--heads 4 --kv-heads 2 --head-dim 16 --dtype bf16 --verify-fraction 1 --quiet --seed 7
       --fail-on-error)
attend=(--workload fixed --fixed-tokens 24 --requests 6 --concurrency 1)
session=(--workload session --decode-api packed-stream --batches-in-flight 2 --batch-sessions 2
         --requests 4 --concurrency 1 --layers 2 --fixed-tokens 12 --max-gen 3)
# get.py FILE: the tolerance, worst rel error, mismatches and outputs checked of either report.
cat >"$dir/get.py" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
v = j.get("verification", j)  # the Attend report nests them under "verification"
print(v["tolerance"], v["worst_rel_error"], v["mismatches"], v.get("checked", v.get("verified")))
PY
for path in attend session; do
  if [ $path = attend ]; then args=("${attend[@]}"); else args=("${session[@]}"); fi
  "$loadgen" --target "$target" "${shape[@]}" "${args[@]}" --json "$dir/$path-0.json" \
    >"$dir/$path-0.txt"
  read -r tol worst mismatches checked < <(python3 "$dir/get.py" "$dir/$path-0.json")
  echo "$path by dtype: tol $tol worst $worst mismatches $mismatches checked $checked"
  python3 -c "import sys; t, w, m, c = map(float, sys.argv[1:]); assert t == 1e-2 and 0 < w < t \
and m == 0 and c > 0, sys.argv" "$tol" "$worst" "$mismatches" "$checked"
  grep -q "tol 0.01" "$dir/$path-0.txt" || { echo "$path: no 'tol 0.01' in the report"; exit 1; }
  low=$(python3 -c "import sys; print(float(sys.argv[1]) / 2)" "$worst")
  high=$(python3 -c "import sys; print(float(sys.argv[1]) * 4)" "$worst")
  rc=0
  "$loadgen" --target "$target" "${shape[@]}" "${args[@]}" --tolerance "$low" \
    --json "$dir/$path-low.json" >"$dir/$path-low.txt" || rc=$?
  read -r tol _ mismatches _ < <(python3 "$dir/get.py" "$dir/$path-low.json")
  echo "$path --tolerance $low: exit $rc, tol $tol, mismatches $mismatches"
  [ "$rc" -eq 1 ] || { echo "$path: a tolerance below the error did not fail the run"; exit 1; }
  python3 -c "import sys; t, l, m = map(float, sys.argv[1:]); assert t == l and m > 0, sys.argv" \
    "$tol" "$low" "$mismatches"
  "$loadgen" --target "$target" "${shape[@]}" "${args[@]}" --tolerance "$high" \
    --json "$dir/$path-high.json" >"$dir/$path-high.txt"
  read -r tol _ mismatches _ < <(python3 "$dir/get.py" "$dir/$path-high.json")
  echo "$path --tolerance $high: tol $tol, mismatches $mismatches"
  python3 -c "import sys; t, h, m = map(float, sys.argv[1:]); assert t == h and m == 0, sys.argv" \
    "$tol" "$high" "$mismatches"
done
echo PASS
