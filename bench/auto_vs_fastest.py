#!/usr/bin/env python3
"""Times `auto` against the fastest named backend on held-out shapes from the Azure trace.

Run against a server that calibrated auto (attention-server --calibrate [--calibration-file F]):

    python3 bench/auto_vs_fastest.py --target 127.0.0.1:50051 --shapes 24

Shapes: B=1, N=K=8 (override --heads/--kv-heads), H=64 (--head-dim), bf16, bottom-right causal
self-attention with T = S = ContextTokens x --token-scale of trace rows, skipping lengths that
are calibration grid points (held out: read from GetServerInfo.auto_calibration). For each shape
every available GPU backend that supports it and `auto` run --reps times, round-robin (the order
rotated each round) after one warm-up round; the median of the
server-reported kernel time (ExecutionReport.times.kernel_us) is compared. Prints one line per
shape and the share of shapes where auto is within 10 % of the fastest (exit 1 with --strict
when any is not).
"""
import argparse
import csv
import math
import os
import re
import statistics
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "client",
                                "python"))
from attention_client import AttentionClient  # noqa: E402


def trace_lengths(path, scale, n, skip):
    out = []
    with open(path) as f:
        for row in csv.DictReader(f):
            t = max(1, int(round(int(row["ContextTokens"]) * scale)))
            if t in skip or t in out:
                continue
            out.append(t)
            if len(out) == n:
                break
    return out


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="127.0.0.1:50051")
    ap.add_argument("--trace", default=os.path.join(here, "..", "client", "data",
                                                    "AzureLLMInferenceTrace_conv.csv"))
    ap.add_argument("--token-scale", type=float, default=1.0)
    ap.add_argument("--shapes", type=int, default=24)
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--strict", action="store_true")
    a = ap.parse_args()

    with AttentionClient(a.target, timeout=120) as c:
        info = c.server_info()
        pb = getattr(info, "raw", info)
        grid = set()
        for e in getattr(pb, "auto_calibration", []):
            m = re.search(r" L(\d+)$", e.bucket)
            if m:
                grid.add(int(m.group(1)))
        if not grid:
            print("warning: the server reports no calibration table (start it with --calibrate)")
        backends = [b.name for b in pb.backends if b.available and b.name not in ("cpu", "fp8")]
        lengths = trace_lengths(a.trace, a.token_scale, a.shapes, grid)
        rng = np.random.default_rng(1)
        within, ratios = 0, []
        for t in lengths:
            q = rng.standard_normal((1, t, a.heads, a.head_dim)).astype(np.float32)
            k = rng.standard_normal((1, t, a.kv_heads, a.head_dim)).astype(np.float32)
            v = rng.standard_normal((1, t, a.kv_heads, a.head_dim)).astype(np.float32)
            # Round-robin over auto and the named backends, so clock and cache drift hit every
            # backend alike, with the order rotated each round, so no backend always runs right
            # after the same one (on the H200, 2026-11-30, auto ran first in every round, after
            # the last round's cudnn, and read 1-2 us slower than fused on the same kernel); the
            # first round warms up (graph builds) and is dropped.
            us = {b: [] for b in ["auto"] + backends}
            auto_ran = "-"
            for rep in range(a.reps + 1):
                names = list(us)
                for b in names[rep % len(names):] + names[:rep % len(names)]:
                    if b not in us:  # dropped earlier in this round
                        continue
                    try:
                        r = c.attend(q, k, v, causal="bottom_right", backend=b, dtype="bfloat16")
                    except Exception as e:  # a backend that cannot run the shape
                        if b == "auto":
                            raise
                        print(f"  T={t} {b}: {str(e).splitlines()[0]}")
                        del us[b]
                        continue
                    if b == "auto":
                        auto_ran = r.report.backend
                    if rep > 0:
                        us[b].append(r.report.times_us["kernel"])
            med = {b: statistics.median(x) for b, x in us.items() if x}
            named = {b: x for b, x in med.items() if b != "auto"}
            best = min(named, key=named.get)
            ratio = med["auto"] / max(named[best], 1e-9)
            ratios.append(ratio)
            within += ratio <= 1.10
            print(f"T={t:6d} auto->{auto_ran:6s} {med['auto']:9.1f} us  fastest {best:6s} "
                  f"{named[best]:9.1f} us  ratio {ratio:5.2f}  "
                  + " ".join(f"{b}={x:.0f}" for b, x in sorted(named.items())))
        gm = math.exp(sum(math.log(r) for r in ratios) / len(ratios)) if ratios else float("nan")
        print(f"auto within 10% of the fastest on {within}/{len(ratios)} held-out shapes; "
              f"geometric mean auto/fastest {gm:.3f}")
        return 1 if (a.strict and within < len(ratios)) else 0


if __name__ == "__main__":
    sys.exit(main())
