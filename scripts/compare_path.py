#!/usr/bin/env python3
"""Issue 17's "no slower" table: the request-path (scripts/gpu_path_bench.sh) and batching
(scripts/gpu_batching_bench.sh) results of two bundles run interleaved by
`gpu_session.sh compare`, as medians over the rounds, side by side with after/before ratios.

Usage: compare_path.py DIR   (DIR/{before,after}/{path,batch}-r<i>/...; writes DIR/compare.json)
Rows: per transport and case (stream1, extend1, batch64) the message p50/p99, server time p50
and kernel p50 (ms; lower is better); per batching mode the steady decode steps/s (higher is
better) and the step p50 (ms). A ratio is after / before: above 1.03 on a ms row or below 0.97
on a steps/s row is the issue's "3 % slower"."""
import glob
import json
import os
import statistics
import sys


def medians(paths, extract):
    vals = {}
    for p in paths:
        try:
            data = json.load(open(p))
        except (OSError, ValueError):
            continue
        for key, v in extract(data):
            if isinstance(v, (int, float)):
                vals.setdefault(key, []).append(v)
    return {k: (statistics.median(v), v) for k, v in vals.items()}


def path_rows(data):
    for case, r in data.items():
        for field in ("message_p50_ms", "message_p99_ms", "server_total_p50_ms", "kernel_p50_ms"):
            yield f"{case} {field}", r.get(field)


def batch_rows(data):
    for mode, r in data.items():
        if isinstance(r, dict) and "steps_per_s_steady" in r:
            # 0 or None: the run had no steady window (a session ended before the last
            # prefill); left out rather than counted as 0 steps/s.
            yield f"batching-{mode} steady_steps_per_s", r.get("steps_per_s_steady") or None
            yield f"batching-{mode} step_p50_ms", (r.get("step_ms") or {}).get("p50")
            errs = r.get("errors") or {}
            yield f"batching-{mode} errors", sum(errs.values()) if isinstance(errs, dict) else errs


def main():
    d = sys.argv[1]
    side = {}
    for s in ("before", "after"):
        side[s] = medians(sorted(glob.glob(os.path.join(d, s, "path-r*", "path-summary.json"))),
                          path_rows)
        side[s].update(medians(
            sorted(glob.glob(os.path.join(d, s, "batch-r*", "batching-summary.json"))), batch_rows))
    keys = sorted(set(side["before"]) | set(side["after"]))
    out = {}
    print(f"{'row':44} {'before':>10} {'after':>10} {'after/before':>12}")
    for k in keys:
        b = side["before"].get(k, (None, []))
        a = side["after"].get(k, (None, []))
        ratio = a[0] / b[0] if a[0] is not None and b[0] else None
        out[k] = {"before": b[0], "after": a[0], "ratio": ratio, "before_runs": b[1],
                  "after_runs": a[1]}
        fmt = lambda x: f"{x:10.3f}" if x is not None else f"{'-':>10}"
        print(f"{k:44} {fmt(b[0])} {fmt(a[0])} {fmt(ratio):>12}")
    json.dump(out, open(os.path.join(d, "compare.json"), "w"), indent=1)


if __name__ == "__main__":
    main()
