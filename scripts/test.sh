#!/usr/bin/env bash
# Every test: install what is missing, check the include rule and the file/function sizes
# (scripts/check_includes.py, check_sizes.py; docs/architecture.md), build (CUDA when nvcc is present), run all ctest suites
# (unit, parity, python, integration; GPU tests skip without a device and say so), then a
# CPU-only AddressSanitizer+UndefinedBehaviorSanitizer build running the unit and integration
# tests, then the request fuzzer for a bounded time (scripts/fuzz.sh, clang build in
# build-fuzz), then the GPU-verification record check (tests/gpu/last_run.json vs kernels/).
# Prints the time of each stage; exits non-zero on the first failing stage.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
stage() { echo; echo "=== $1 ($(date -u +%H:%M:%S))"; stage_start=$(date +%s); }
stage_end() { echo "=== $1 took $(( $(date +%s) - stage_start ))s"; }

stage "bootstrap"; "$root/scripts/bootstrap.sh"; stage_end bootstrap
stage "source checks (include rule, sizes)"
python3 "$root/scripts/check_includes.py" && python3 "$root/scripts/check_sizes.py"
stage_end "source checks"
stage "build"; "$root/scripts/build.sh"; stage_end build
stage "ctest (default build)"
ctest --test-dir "$root/build" --output-on-failure -j 2 --timeout 600
stage_end "ctest (default build)"
stage "build (asan+ubsan, cpu only)"; "$root/scripts/build.sh" --sanitize; stage_end "asan build"
stage "ctest (asan+ubsan: unit + integration)"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  LSAN_OPTIONS=suppressions="$root/tests/lsan.supp" \
  ctest --test-dir "$root/build-asan" --output-on-failure -L "unit|integration|sanitize" -j 2 \
  --timeout 900
stage_end "asan ctest"
stage "fuzz (libFuzzer request harness, ${ATTN_FUZZ_SECONDS:-60} s)"
"$root/scripts/fuzz.sh" "${ATTN_FUZZ_SECONDS:-60}"; stage_end "fuzz"
stage "gpu record check"; "$root/scripts/check_gpu_record.sh"; stage_end "gpu record check"
echo; echo "all test stages passed"
