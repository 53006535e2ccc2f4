#!/usr/bin/env bash
# GPU verification run (DESIGN.md §10, §11), for the H200 host (Ubuntu 24.04, CUDA 13.0, cmake,
# ninja, GoogleTest; no gRPC/spdlog/prometheus). From the repository root:
#   OUT=out ATTN_KERNELS_TREE=$(scripts/check_gpu_record.sh --print-tree) bash scripts/gpu_check.sh
# (compute the tree hash where the git checkout is; the device copy may have no .git).
# Builds kernels + tests twice with -DATTN_SERVER=OFF, in parallel (-j8 each by default):
#   default: CMAKE_CUDA_ARCHITECTURES 89;90a            -> build-h200
#   l4:      CMAKE_CUDA_ARCHITECTURES=89, ATTN_EMULATE_L4=ON -> build-l4 (sm_89 PTX JIT on Hopper)
# then runs `ctest -L gpu` in each, both builds and the long tests side by side (run_tests).
# Writes under $OUT:
#   nvidia-smi.txt, <build>-configure.log, <build>-build.log, <build>-ctest.log,
#   <build>-ctest.xml (JUnit), parity-<build>.jsonl (per-case parity results),
#   probe-<build>.json, summary.json (input of scripts/gpu_record.py)
# and prints a summary table last. Exit status: 0 only when both builds pass with no failures.
# Env: OUT (default out), ATTN_KERNELS_TREE (recorded as given), JOBS (default 8),
#      BUILD_TYPE (default Release), CTEST_ARGS (extra ctest arguments), GPU_CHECK_ALL=1 (build
#      every target, not only the gpu-labelled tests' executables), BUILD_ROOT (default: the
#      repository root) for the two build directories.
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
OUT=${OUT:-out}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
JOBS=${JOBS:-8}
BUILD_ROOT=${BUILD_ROOT:-$root}  # where build-h200/ and build-l4/ go
BUILD_TYPE=${BUILD_TYPE:-Release}
tree=${ATTN_KERNELS_TREE:-}
if [ -z "$tree" ]; then
  tree=$(bash "$root/scripts/check_gpu_record.sh" --print-tree 2>/dev/null | tail -n1)
fi
[[ "$tree" =~ ^[0-9a-f]{40}$ ]] || tree="unknown (set ATTN_KERNELS_TREE)"
# The cuDNN the tests load at run time (libcudnn is dlopen'ed) needs no LD_LIBRARY_PATH: the
# search of kernels/include/attn/kernels/cudnn_library.h skips the image's older system cuDNN
# (9.14: older minor than the build's headers) and finds PyTorch's 9.19.0 in /opt/torch/.venv.
started=$(date -u +%Y-%m-%dT%H:%M:%SZ)
t0=$(date +%s)

echo "== gpu_check: kernels tree $tree, out $OUT"
if command -v nvidia-smi >/dev/null 2>&1; then
  nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv,noheader \
    | tee "$OUT/nvidia-smi.txt"
else
  echo "nvidia-smi not found" | tee "$OUT/nvidia-smi.txt"
fi
device=$(head -n1 "$OUT/nvidia-smi.txt" | cut -d, -f1 | sed 's/[[:space:]]*$//')

build() {  # name dir [cmake args...]
  local name=$1 dir=$2
  shift 2
  echo failed >"$OUT/$name-build.status"
  cmake -S "$root" -B "$BUILD_ROOT/$dir" -G Ninja -DATTN_SERVER=OFF -DCMAKE_BUILD_TYPE="$BUILD_TYPE" "$@" \
    >"$OUT/$name-configure.log" 2>&1 || return
  # Only the executables of the gpu-labelled tests (each named like its target), unless
  # GPU_CHECK_ALL=1 or the list comes out empty: then everything.
  local targets=""
  if [ "${GPU_CHECK_ALL:-0}" != 1 ]; then
    targets=$(ctest --test-dir "$BUILD_ROOT/$dir" -N -L gpu 2>/dev/null |
              sed -n 's/^ *Test *#[0-9]*: *\([A-Za-z0-9_.-]*\).*/\1/p' | tr '\n' ' ')
  fi
  echo "targets: ${targets:-all}" >"$OUT/$name-build.log"
  if [ -n "$targets" ]; then
    # shellcheck disable=SC2086
    cmake --build "$BUILD_ROOT/$dir" -j "$JOBS" --target $targets >>"$OUT/$name-build.log" 2>&1 || return
  else
    cmake --build "$BUILD_ROOT/$dir" -j "$JOBS" >>"$OUT/$name-build.log" 2>&1 || return
  fi
  echo ok >"$OUT/$name-build.status"
}

echo "== building default (89;90a) and l4 (89, emulate L4) in parallel, -j$JOBS each"
build default build-h200 &
p1=$!
build l4 build-l4 -DCMAKE_CUDA_ARCHITECTURES=89 -DATTN_EMULATE_L4=ON &
p2=$!
wait $p1 $p2
echo "== builds done after $(( $(date +%s) - t0 ))s: default $(cat "$OUT/default-build.status"), l4 $(cat "$OUT/l4-build.status")"

run_group() {  # name dir group ctest-selection...: one ctest process, its own log and parity file
  local name=$1 dir=$2 group=$3
  shift 3
  ATTN_PARITY_OUT="$OUT/parity-$name.$group.jsonl" ATTN_PROBE_OUT="$OUT/probe-$name.json" \
    ctest --test-dir "$BUILD_ROOT/$dir" -L gpu "$@" --output-on-failure \
    --output-junit "$OUT/$name.$group-ctest.xml" ${CTEST_ARGS:-} >"$OUT/$name.$group-ctest.log" 2>&1
  echo "ctest ($group) exit $?" >>"$OUT/$name.$group-ctest.log"
}
run_tests() {  # name dir
  local name=$1 dir=$2
  rm -f "$OUT/parity-$name".*jsonl "$OUT/probe-$name.json" "$OUT/$name".*-ctest.*
  if [ "$(cat "$OUT/$name-build.status")" != ok ]; then
    echo "== $name: build failed, see $OUT/$name-build.log"; tail -n 30 "$OUT/$name-build.log"
    return
  fi
  echo "== ctest -L gpu ($name)"
  # The tests are correctness only (nothing here is timed), so the long ones run side by side:
  # paged_decode_test (~120 s, float64 references), cudnn_parity_test (~270 s, mostly cuDNN
  # graph builds on the CPU) and the rest, each group with its own log and parity file
  # (merged below). cudnn_parity_test runs in the default build only: cuDNN picks its kernels by
  # the device it runs on (sm_90 on the H200), so in the L4 build it would repeat the default
  # build's run; cuDNN's sm_89 kernels need a real L4.
  local pids=()
  run_group "$name" "$dir" decode -R '^paged_decode_test$' & pids+=($!)
  if [ "$name" = default ]; then
    run_group "$name" "$dir" cudnn -R '^cudnn_parity_test$' & pids+=($!)
  fi
  run_group "$name" "$dir" rest -E '^(paged_decode_test|cudnn_parity_test)$' & pids+=($!)
  wait "${pids[@]}"
  cat "$OUT/$name".*-ctest.log >"$OUT/$name-ctest.log"
  cat "$OUT/parity-$name".*.jsonl >"$OUT/parity-$name.jsonl" 2>/dev/null
  grep -E "Test +#|tests passed|Skipped|Failed|\[(grid|head_dims|large)" "$OUT/$name-ctest.log" | tail -n 40
}
# The two builds' tests share the one GPU; running them side by side halves the wall time
# (correctness only: nothing here is timed). GPU_CHECK_SERIAL=1 runs them one after the other.
if [ "${GPU_CHECK_SERIAL:-0}" = 1 ]; then
  run_tests default build-h200
  run_tests l4 build-l4
else
  run_tests default build-h200 >"$OUT/default-tests.txt" 2>&1 &
  q1=$!
  run_tests l4 build-l4 >"$OUT/l4-tests.txt" 2>&1 &
  q2=$!
  wait $q1 $q2
  cat "$OUT/default-tests.txt" "$OUT/l4-tests.txt"
fi

# Summary JSON from the ctest logs (per test: Passed / ***Failed / ***Skipped / ...).
python3 - "$OUT" "$tree" "$device" "$started" "$(( $(date +%s) - t0 ))" <<'PY'
import json, os, re, sys
out, tree, device, started, secs = sys.argv[1:6]
summary = {
    "kernels_tree": tree, "date": started, "device": device, "wall_s": int(secs),
    "command": "OUT=%s ATTN_KERNELS_TREE=%s bash scripts/gpu_check.sh" % (os.path.basename(out), tree),
    "nvidia_smi": open(os.path.join(out, "nvidia-smi.txt")).read().strip(),
    "builds": {},
}
for name in ("default", "l4"):
    b = {"build": open(os.path.join(out, name + "-build.status")).read().strip(),
         "passed": 0, "failed": 0, "skipped": 0, "tests": {}}
    log = os.path.join(out, name + "-ctest.log")
    if os.path.exists(log):
        for line in open(log, errors="replace"):
            m = re.search(r"Test\s+#\d+:\s+(\S+)\s+\.+\s*(.*?)\s+[\d.]+\s+sec", line)
            if not m:
                continue
            test, status = m.group(1), m.group(2).strip("* ").strip()
            b["tests"][test] = status
            if status == "Passed":
                b["passed"] += 1
            elif status.startswith("Skipped"):
                b["skipped"] += 1
            else:  # Failed, Timeout, Exception, Not Run, ...
                b["failed"] += 1
    if b["build"] != "ok":
        b["failed"] += 1
    parity = os.path.join(out, "parity-%s.jsonl" % name)
    if os.path.exists(parity):
        counts = {}
        for line in open(parity):
            try:
                s = json.loads(line)["status"]
            except Exception:
                continue
            counts[s] = counts.get(s, 0) + 1
        b["parity_cases"] = counts
    probe = os.path.join(out, "probe-%s.json" % name)
    if os.path.exists(probe):
        b["probe_arch"] = json.load(open(probe)).get("probe_arch")
    summary["builds"][name] = b
json.dump(summary, open(os.path.join(out, "summary.json"), "w"), indent=2)
print()
print("== summary (kernels tree %s, %s, %ss)" % (tree, device, secs))
print("%-8s %-6s %6s %6s %7s %6s  %s" % ("build", "make", "passed", "failed", "skipped", "probe", "parity cases"))
ok = True
for name, b in summary["builds"].items():
    print("%-8s %-6s %6d %6d %7d %6s  %s" % (name, b["build"], b["passed"], b["failed"], b["skipped"],
          b.get("probe_arch", "-"), b.get("parity_cases", {})))
    for t, s in sorted(b["tests"].items()):
        print("           %-28s %s" % (t, s))
    # On the GPU host nothing may skip: a skipped GPU test there means no device was seen.
    ok = ok and b["build"] == "ok" and b["failed"] == 0 and b["skipped"] == 0 and b["passed"] > 0
print("RESULT:", "PASS" if ok else "FAIL", "-> %s/summary.json" % out)
sys.exit(0 if ok else 1)
PY
