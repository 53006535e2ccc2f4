#!/usr/bin/env python3
"""Plots an attention-loadgen sweep CSV (sweep-<kind>.csv) as a PNG.

Usage: plot_sweep.py CSV PNG [KIND]
Two panels against the sweep point, one line per backend: p50 latency (ms, with the p99 as a
dashed line) and achieved TFLOP/s (server flops / kernel time). Exit 3 when matplotlib is
missing, 2 on a bad CSV.
"""
import csv
import sys


def main(argv):
    if len(argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    csv_path, png_path = argv[1], argv[2]
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        print(f"plot_sweep.py: matplotlib is not available ({e}); "
              "install it with `python3 -m pip install matplotlib`", file=sys.stderr)
        return 3
    with open(csv_path, newline="") as f:
        rows = list(csv.DictReader(f))
    if not rows:
        print(f"plot_sweep.py: {csv_path} has no rows", file=sys.stderr)
        return 2
    kind = argv[3] if len(argv) > 3 else rows[0]["sweep"]
    points = []
    for r in rows:
        if r["point"] not in points:
            points.append(r["point"])
    backends = []
    for r in rows:
        if r["backend"] not in backends:
            backends.append(r["backend"])
    x = list(range(len(points)))
    fig, (ax_lat, ax_tf) = plt.subplots(1, 2, figsize=(11, 4.2))
    for b in backends:
        by_point = {r["point"]: r for r in rows if r["backend"] == b}
        xs = [i for i, p in enumerate(points) if p in by_point]
        p50 = [float(by_point[points[i]]["p50_ms"]) for i in xs]
        p99 = [float(by_point[points[i]]["p99_ms"]) for i in xs]
        tf = [float(by_point[points[i]]["tflops"]) for i in xs]
        line, = ax_lat.plot(xs, p50, marker="o", label=f"{b} p50")
        ax_lat.plot(xs, p99, linestyle="--", color=line.get_color(), label=f"{b} p99")
        ax_tf.plot(xs, tf, marker="o", label=b)
    names = {"seq": "sequence length", "batch": "batch size", "heads": "head layout"}
    for ax in (ax_lat, ax_tf):
        ax.set_xticks(x)
        ax.set_xticklabels(points, rotation=20)
        ax.set_xlabel(names.get(kind, kind))
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    ax_lat.set_ylabel("latency (ms)")
    ax_lat.set_yscale("log")
    ax_tf.set_ylabel("achieved TFLOP/s")
    fig.suptitle(f"attention-loadgen sweep: {names.get(kind, kind)}")
    fig.tight_layout()
    fig.savefig(png_path, dpi=100)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
