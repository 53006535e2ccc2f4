#!/usr/bin/env bash
# CI guard (DESIGN.md §10): GPU regressions cannot land green.
# Computes the "kernels tree": the git tree hash of a tree holding exactly kernels/ and common/
# (the header-only attn_common the kernels compile against: Status) as they are in the working
# tree (committed or not; for a clean checkout this equals
# `git ls-tree HEAD kernels common | git mktree`), and compares it with
# tests/gpu/last_run.json's "kernels_tree" (written by scripts/gpu_record.py after an H200 run
# of scripts/gpu_check.sh). On a mismatch it passes only when tests/gpu/UNVERIFIED has a line
#     <current kernels tree hash> <reason why this change is not GPU-verified>
# `check_gpu_record.sh --print-tree` prints only the current kernels tree hash (the value to pass
# as ATTN_KERNELS_TREE to scripts/gpu_check.sh).
# Exit: 0 ok, 1 mismatch (or a failing recorded run), 77 not a git checkout (ctest: skipped).
# Side-effect free: blobs/trees are written to a temporary object directory, not .git/objects.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

if ! git rev-parse --is-inside-work-tree >/dev/null 2>&1 || ! git rev-parse -q --verify HEAD >/dev/null; then
  echo "check_gpu_record: not a git checkout with a commit: skipped"
  exit 77
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
objects=$(git rev-parse --path-format=absolute --git-path objects)
# An empty temporary index, then kernels/ and common/ added from the working tree (honouring
# .gitignore, so build outputs do not count); objects go to $tmp/objects only.
mkdir -p "$tmp/objects"
export GIT_INDEX_FILE="$tmp/index" GIT_OBJECT_DIRECTORY="$tmp/objects"
export GIT_ALTERNATE_OBJECT_DIRECTORIES="$objects"
git read-tree --empty
git add -A -- kernels common
tree=$(git write-tree)
head_tree=$(git ls-tree HEAD kernels common | git mktree)
unset GIT_INDEX_FILE GIT_OBJECT_DIRECTORY GIT_ALTERNATE_OBJECT_DIRECTORIES
if [ "${1:-}" = "--print-tree" ]; then
  echo "$tree"
  exit 0
fi

record=tests/gpu/last_run.json
recorded=""
if [ -f "$record" ]; then
  recorded=$(sed -n 's/.*"kernels_tree"[[:space:]]*:[[:space:]]*"\([0-9a-f]*\)".*/\1/p' "$record" | head -n1)
fi
echo "check_gpu_record: kernels tree (working tree) $tree"
[ "$tree" != "$head_tree" ] && echo "check_gpu_record: kernels tree at HEAD         $head_tree"
echo "check_gpu_record: recorded in $record: ${recorded:-<none>}"

if [ -n "$recorded" ] && [ "$recorded" = "$tree" ]; then
  # The recorded run must itself be green.
  if command -v python3 >/dev/null 2>&1; then
    if ! python3 - "$record" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
bad = [f"{name}: failed={b.get('failed')} passed={b.get('passed')}"
       for name, b in r.get("builds", {}).items()
       if b.get("failed", 1) != 0 or b.get("passed", 0) <= 0]
if not r.get("builds"):
    bad.append("no builds recorded")
if bad:
    print("check_gpu_record: the recorded GPU run is not green: " + "; ".join(bad))
    sys.exit(1)
PY
    then
      exit 1
    fi
  fi
  echo "check_gpu_record: OK (kernels/ and common/ verified on GPU: $(sed -n 's/.*"device"[[:space:]]*:[[:space:]]*"\([^"]*\)".*/\1/p' "$record" | head -n1))"
  exit 0
fi

unverified=tests/gpu/UNVERIFIED
if [ -f "$unverified" ] && grep -Eq "^[[:space:]]*${tree}[[:space:]]+[^[:space:]#]" "$unverified"; then
  echo "check_gpu_record: OK (unverified on GPU, reason given in $unverified):"
  grep -E "^[[:space:]]*${tree}[[:space:]]" "$unverified" | sed 's/^/  /'
  exit 0
fi

cat >&2 <<MSG
check_gpu_record: ERROR: kernels/ or common/ changed since the last recorded GPU run.
  current kernels tree: $tree
  recorded ($record): ${recorded:-<missing>}
Either run the GPU checks on the H200 and record them:
  OUT=out ATTN_KERNELS_TREE=$tree bash scripts/gpu_check.sh     # on the GPU machine
  python3 scripts/gpu_record.py out/summary.json                 # here, writes $record
or, if this change cannot be verified on a GPU now, add a line to $unverified:
  $tree <reason>
MSG
exit 1
