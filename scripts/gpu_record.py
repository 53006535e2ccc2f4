#!/usr/bin/env python3
"""Records a GPU verification run (DESIGN.md §10) into tests/gpu/last_run.json.

Usage: python3 scripts/gpu_record.py <summary.json from scripts/gpu_check.sh>
           [--out tests/gpu/last_run.json] [--allow-failures]

Writes {kernels_tree, date, device, builds: {default: {passed, failed, skipped, probe_arch},
l4: {passed, failed, skipped, probe_arch}}, command}. Refuses (exit 1) when the run is not green
(a build failed, a test failed or skipped, nothing passed, the L4 probe is not 890) or the
kernels tree is unknown, unless --allow-failures (the record then still fails the CI check,
which requires failed == 0). scripts/check_gpu_record.sh compares kernels_tree with the
current kernels/ tree.
"""
import argparse
import json
import os
import re
import sys


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("summary")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "tests", "gpu",
                                                  "last_run.json"))
    ap.add_argument("--allow-failures", action="store_true")
    args = ap.parse_args()

    s = json.load(open(args.summary))
    problems = []
    tree = s.get("kernels_tree", "")
    if not re.fullmatch(r"[0-9a-f]{40}", tree or ""):
        problems.append("kernels_tree %r is not a git tree hash (pass ATTN_KERNELS_TREE)" % tree)
    builds = {}
    for name in ("default", "l4"):
        b = s.get("builds", {}).get(name)
        if b is None:
            problems.append("build %s missing from the summary" % name)
            continue
        rec = {k: int(b.get(k, 0)) for k in ("passed", "failed", "skipped")}
        if b.get("probe_arch") is not None:
            rec["probe_arch"] = int(b["probe_arch"])
        if b.get("parity_cases"):
            rec["parity_cases"] = b["parity_cases"]
        builds[name] = rec
        if b.get("build") != "ok":
            problems.append("%s: build %s" % (name, b.get("build")))
        if rec["failed"] or rec["skipped"] or rec["passed"] <= 0:
            problems.append("%s: passed=%d failed=%d skipped=%d" %
                            (name, rec["passed"], rec["failed"], rec["skipped"]))
    if "l4" in builds and builds["l4"].get("probe_arch") != 890:
        problems.append("l4: probe_arch %s, expected 890" % builds["l4"].get("probe_arch"))
    if problems and not args.allow_failures:
        print("gpu_record: not recording a run that is not green:", file=sys.stderr)
        for p in problems:
            print("  " + p, file=sys.stderr)
        return 1
    record = {
        "kernels_tree": tree,
        "date": s.get("date", ""),
        "device": s.get("device", ""),
        "builds": builds,
        "command": s.get("command", ""),
    }
    with open(args.out, "w") as f:
        json.dump(record, f, indent=2)
        f.write("\n")
    print("gpu_record: wrote %s (kernels tree %s, %s)" % (os.path.normpath(args.out), tree,
                                                          record["device"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
