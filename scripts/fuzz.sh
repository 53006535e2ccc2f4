#!/usr/bin/env bash
# Request fuzzing (tests/fuzz/): configures a clang, CPU-only build with libFuzzer + ASan + UBSan
# in build-fuzz (ATTN_FUZZ=ON), builds request_fuzzer, and fuzzes for a bounded time starting
# from the committed seed corpus (tests/fuzz/corpus, read only: new inputs go to a temporary
# folder). A crash, sanitizer report, leak, timeout or invariant violation fails the run; the
# input that caused it is written to build-fuzz/artifacts/ and printed: add it to
# tests/fuzz/regressions/ (replayed by the `fuzz_regressions` ctest test) with the fix.
# Usage: scripts/fuzz.sh [seconds (default 60)] [extra libFuzzer flags...]
#   ATTN_FUZZ_BUILD_DIR (default build-fuzz), ATTN_BUILD_JOBS (default nproc).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
seconds=${1:-60}
shift || true
dir=${ATTN_FUZZ_BUILD_DIR:-$root/build-fuzz}
jobs=${ATTN_BUILD_JOBS:-$(nproc)}
for tool in clang clang++; do
  command -v "$tool" >/dev/null || { echo "fuzz: $tool not found (scripts/bootstrap.sh installs it)" >&2; exit 1; }
done
mkdir -p "$dir"
cmake -S "$root" -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
  -DATTN_CUDA=OFF -DATTN_FUZZ=ON >"$dir.configure.log" 2>&1 || { cat "$dir.configure.log"; exit 1; }
cmake --build "$dir" -j "$jobs" --target request_fuzzer

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$dir/artifacts"
# The committed corpus seeds the run; libFuzzer writes what it finds into the first folder.
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$root/tests/lsan.supp}
echo "fuzz: request_fuzzer for ${seconds}s (seed corpus $(ls "$root/tests/fuzz/corpus" | wc -l) files)"
"$dir/tests/fuzz/request_fuzzer" "$work" "$root/tests/fuzz/corpus" \
  -max_total_time="$seconds" -max_len=65536 -timeout=10 -rss_limit_mb=2048 -malloc_limit_mb=256 \
  -print_final_stats=1 \
  -artifact_prefix="$dir/artifacts/" "$@"
echo "fuzz: no failure in ${seconds}s; $(ls "$work" | wc -l) new corpus inputs (not kept)"
