#!/usr/bin/env bash
# Integration: scripts/multiproc_bench.sh end to end on the cpu KV cache (KV_DEVICE=cpu) with
# tiny shapes: one server, P=2 loadgens started together, each decoding 4 sequences as one
# packed-stream group (2 micro-batches in flight), every output verified. Passes when both
# loadgens exit 0 and multiproc-summary.json has both reports, an aggregate steady rate > 0
# (equal to the sum of the two per-process rates), 0 errors, 0 mismatches, message percentiles
# and the server's decode-only batch totals; each report's steady window lies inside its run on the
# wall clock (start_unix_s, steady_from_s).
# Usage: multiproc_bench_test.sh SOURCE_DIR ATTENTION_SERVER ATTENTION_LOADGEN
set -euo pipefail
src=$1
server=$2
loadgen=$3
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
# RUN: a launcher taking the binary name first, as the bundle's run.sh does.
cat >"$dir/run.sh" <<EOF
#!/usr/bin/env bash
name=\$1; shift
case \$name in
  attention-server) exec "$server" "\$@" ;;
  attention-loadgen) exec "$loadgen" "\$@" ;;
  *) echo "run.sh: unknown binary \$name" >&2; exit 127 ;;
esac
EOF
chmod +x "$dir/run.sh"
RUN="$dir/run.sh" KV_DEVICE=cpu P=2 CONTEXT=24 STEPS=6 SESSIONS=4 HEADS=4 KV_HEADS=2 \
  HEAD_DIM=16 DTYPE=bf16 VERIFY_FRACTION=1 LOADGEN_TIMEOUT=60 OUT="$dir/out" \
  bash "$src/scripts/multiproc_bench.sh"
t0=$(date +%s)
python3 - "$dir/out/multiproc-summary.json" "$t0" "$dir/out" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
# Each report's steady window on the wall clock: inside its run, the run within this test.
for i in (1, 2):
    r = json.load(open(f"{sys.argv[3]}/multiproc-{i}.json"))
    assert float(sys.argv[2]) - 120 < r["start_unix_s"] <= float(sys.argv[2]) + 1, r
    assert 0 < r["steady_from_s"] and r["steady_window_s"] > 0, r
    assert r["steady_from_s"] + r["steady_window_s"] <= r["wall_s"], r
assert s["processes"] == 2 and s["reports"] == 2 and s["exit_codes"] == [0, 0], s
assert s["sessions"] == 8 and s["sessions_ok"] == 8, s
assert s["errors"] == 0 and s["mismatches"] == 0, s
assert s["decode_steps"] == 2 * 4 * 6, s
rates = s["per_process_steady_decode_steps_per_s"]
assert len(rates) == 2 and all(r > 0 for r in rates), s
assert s["aggregate_steady_decode_steps_per_s"] > 0, s
assert abs(s["aggregate_steady_decode_steps_per_s"] - sum(rates)) < 1e-9, s
assert s["aggregate_decode_steps_per_s"] > 0, s
assert s["message_p50_ms"] > 0 and s["message_p99_ms"] >= s["message_p50_ms"], s
assert s["server_decode_batches"] and s["server_decode_batches"] > 0, s
assert s["server_steps_per_batch"] >= 1, s
assert 0 <= s["window_coverage"] <= 1, s
print("summary ok:", {k: s[k] for k in ("aggregate_steady_decode_steps_per_s", "ratio",
                                        "kernel_only_source", "common_window_s")})
PY
echo PASS
