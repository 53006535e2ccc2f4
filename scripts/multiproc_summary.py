#!/usr/bin/env python3
"""Combines the reports of scripts/multiproc_bench.sh into <out>/multiproc-summary.json.

Inputs: <out>/multiproc-<i>.json for i in 1..P (attention-loadgen --json of a session run,
client/loadgen/session_report_json.cc) and the server's log, whose info line at SIGTERM
"sequence steps, decode-only batches: B batches, S steps per batch; mean per batch (us): wall W,
kernels K, ..." (server/batching/step_batcher.cc) gives the kernel time per batch.

Output keys (rates in loadgen decode steps per second, one step = one token through every
layer; times in ms):
  processes, reports, exit_codes, sessions, sessions_ok, errors (sum of error counts),
  mismatches, decode_steps;
  per_process_steady_decode_steps_per_s;
  aggregate_steady_decode_steps_per_s: the sum of the per-process steady rates, each over its
    own steady window (every session of that process decoding). An approximation of the rate
    over the common window: each process's rate is taken as uniform over its window;
  common_window_s: the overlap of all P steady windows on the wall clock (0: none),
    window_coverage: common_window_s / the mean window (1: the windows coincide);
  aggregate_decode_steps_per_s: every decode step over the span from the first start to the
    last end (prefills included; a lower bound);
  message_p50_ms / message_p99_ms: medians over processes of their p50 / p99 (one message =
    one micro-batch's write to its reply), message_p99_max_ms: the largest p99;
  server_batch_kernel_p50_ms: median over processes of their server batch kernel p50;
  server_decode_batches, server_steps_per_batch, server_kernel_us_per_batch,
    server_wall_us_per_batch: the server's decode-only batch totals (null when not logged);
  kernel_only_steps_per_s: steps per batch / kernel time per batch / layers, from the server
    log; else (kernel_only_source "client") the median over processes of server_batch_size p50
    / server_batch_kernel_ms p50, which counts a packed request's steps only (a server batch
    may hold several micro-batches), so it understates the kernel-only rate;
  ratio: aggregate_steady / kernel_only (null without a kernel time), target_ratio 0.7. The
    kernel-only rate takes the batches to run one after another; where batches run at once
    (several batch threads on the cpu KV cache) the ratio can exceed 1.
Exit 1 when no report could be read.
"""
import argparse
import json
import os
import re
import statistics
import sys

LOG_RE = re.compile(
    r"sequence steps, decode-only batches: (\d+) batches, ([\d.]+) steps per batch; "
    r"mean per batch \(us\): wall ([\d.]+), kernels ([\d.]+)")


def quantile(report, key, q):
    """report[key][q] when that summary has samples, else None."""
    v = report.get(key) or {}
    return v.get(q) if v.get("count") else None


def median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def server_totals(path):
    """(batches, steps per batch, wall us, kernel us) of the last decode-only totals line."""
    try:
        text = open(path, errors="replace").read()
    except OSError:
        return None
    found = LOG_RE.findall(text)
    if not found:
        return None
    b, s, w, k = found[-1]
    return int(b), float(s), float(w), float(k)


def summarize(reports, exit_codes, processes, layers, totals):
    s = {"processes": processes, "reports": len(reports), "exit_codes": exit_codes}
    s["sessions"] = sum(r.get("sessions", 0) for r in reports)
    s["sessions_ok"] = sum(r.get("sessions_ok", 0) for r in reports)
    s["errors"] = sum(sum((r.get("errors") or {}).values()) for r in reports)
    s["mismatches"] = sum(r.get("mismatches", 0) for r in reports)
    s["decode_steps"] = sum(r.get("decode_steps", 0) for r in reports)
    rates = [r.get("steady_decode_steps_per_s", 0) for r in reports]
    s["per_process_steady_decode_steps_per_s"] = rates
    s["aggregate_steady_decode_steps_per_s"] = sum(rates)
    windows = [(r["start_unix_s"] + r["steady_from_s"],
                r["start_unix_s"] + r["steady_from_s"] + r["steady_window_s"])
               for r in reports if r.get("steady_window_s", 0) > 0 and "start_unix_s" in r]
    common = 0.0
    if windows and len(windows) == len(reports):
        common = max(0.0, min(t for _, t in windows) - max(f for f, _ in windows))
    s["common_window_s"] = common
    mean_window = statistics.mean(t - f for f, t in windows) if windows else 0
    s["window_coverage"] = common / mean_window if mean_window > 0 else 0
    starts = [r["start_unix_s"] for r in reports if "start_unix_s" in r]
    ends = [r["start_unix_s"] + r.get("wall_s", 0) for r in reports if "start_unix_s" in r]
    span = max(ends) - min(starts) if starts else 0
    s["aggregate_decode_steps_per_s"] = s["decode_steps"] / span if span > 0 else 0
    s["message_p50_ms"] = median(quantile(r, "message_latency_ms", "p50") for r in reports)
    s["message_p99_ms"] = median(quantile(r, "message_latency_ms", "p99") for r in reports)
    p99s = [x for x in (quantile(r, "message_latency_ms", "p99") for r in reports) if x is not None]
    s["message_p99_max_ms"] = max(p99s) if p99s else None
    kernel_p50 = median(quantile(r, "server_batch_kernel_ms", "p50") for r in reports)
    s["server_batch_kernel_p50_ms"] = kernel_p50
    s["server_decode_batches"] = totals[0] if totals else None
    s["server_steps_per_batch"] = totals[1] if totals else None
    s["server_wall_us_per_batch"] = totals[2] if totals else None
    s["server_kernel_us_per_batch"] = totals[3] if totals else None
    kernel_only, source = None, None
    if totals and totals[3] > 0:
        kernel_only, source = totals[1] / (totals[3] * 1e-6) / layers, "server log"
    else:
        size_p50 = median(quantile(r, "server_batch_size", "p50") for r in reports)
        if size_p50 and kernel_p50:
            kernel_only, source = size_p50 / (kernel_p50 * 1e-3) / layers, "client"
    s["kernel_only_steps_per_s"] = kernel_only
    s["kernel_only_source"] = source
    s["ratio"] = s["aggregate_steady_decode_steps_per_s"] / kernel_only if kernel_only else None
    s["target_ratio"] = 0.7
    return s


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="directory of multiproc-<i>.json")
    ap.add_argument("--processes", type=int, required=True)
    ap.add_argument("--layers", type=int, default=1)
    ap.add_argument("--server-log", default="")
    ap.add_argument("--exit-codes", default="", help="the loadgens' exit codes, space separated")
    a = ap.parse_args()
    reports = []
    for i in range(1, a.processes + 1):
        try:
            reports.append(json.load(open(os.path.join(a.out, f"multiproc-{i}.json"))))
        except (OSError, ValueError) as e:
            print(f"multiproc: report {i}: {e}", file=sys.stderr)
    if not reports:
        return 1
    codes = [int(c) for c in a.exit_codes.split()]
    s = summarize(reports, codes, a.processes, a.layers, server_totals(a.server_log))
    with open(os.path.join(a.out, "multiproc-summary.json"), "w") as f:
        json.dump(s, f, indent=1)
    fmt = lambda x, spec=".1f": "-" if x is None else format(x, spec)
    print(f"processes {s['reports']}/{s['processes']} (exits {codes}), sessions "
          f"{s['sessions_ok']}/{s['sessions']} ok, errors {s['errors']}, "
          f"mismatches {s['mismatches']}")
    print(f"aggregate steady decode   {fmt(s['aggregate_steady_decode_steps_per_s'])} steps/s "
          f"(per process {[round(x, 1) for x in s['per_process_steady_decode_steps_per_s']]}; "
          f"common window {s['common_window_s']:.3f} s, coverage {s['window_coverage']:.2f})")
    print(f"aggregate over the run    {fmt(s['aggregate_decode_steps_per_s'])} steps/s "
          "(prefills included)")
    print(f"message p50 / p99 / max   {fmt(s['message_p50_ms'], '.3f')} / "
          f"{fmt(s['message_p99_ms'], '.3f')} / {fmt(s['message_p99_max_ms'], '.3f')} ms")
    print(f"server batch kernel p50   {fmt(s['server_batch_kernel_p50_ms'], '.3f')} ms; "
          f"decode-only batches {s['server_decode_batches']}, "
          f"{fmt(s['server_steps_per_batch'])} steps, kernels "
          f"{fmt(s['server_kernel_us_per_batch'])} us, wall {fmt(s['server_wall_us_per_batch'])}"
          " us per batch")
    print(f"kernel-only rate          {fmt(s['kernel_only_steps_per_s'])} steps/s "
          f"({s['kernel_only_source']}); ratio {fmt(s['ratio'], '.3f')} "
          f"(target >= {s['target_ratio']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
