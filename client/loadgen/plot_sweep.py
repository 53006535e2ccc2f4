#!/usr/bin/env python3
"""Plots an attention-loadgen sweep CSV (sweep-<kind>.csv) as a PNG.

Usage: plot_sweep.py CSV PNG [KIND] [TITLE]
Two panels against the sweep point, one line per backend: p50 latency (ms, with the p99 as a
dashed line; log axis with plain-number labels) and achieved TFLOP/s (server flops / kernel
time, each launch counted once). TITLE (attention-loadgen passes the device, backends, shape,
dtype and date) heads the figure. Failed points (empty cells, an error column) are left out of
the lines, never drawn as 0, and marked with an x at the bottom of the latency panel. Exit 3
when matplotlib is missing, 2 on a bad CSV.
"""
import csv
import math
import sys


def number(cell):
    """A CSV cell as a float; NaN when empty or not a number (a failed point)."""
    try:
        return float(cell)
    except (TypeError, ValueError):
        return math.nan


def plain(value, _pos=None):
    """Tick label as a plain number (40, 0.5, 1200), never 4x10^1."""
    if value <= 0 or not math.isfinite(value):
        return ""
    return f"{value:g}"


def plain_minor(ax):
    """Minor log tick labels of `ax` as plain numbers: every one when the axis spans less than
    about a decade (no major tick may be visible), else only 2x and 5x a power of ten, so the
    labels do not collide."""
    def label(value, _pos=None):
        if value <= 0 or not math.isfinite(value):
            return ""
        low, high = ax.get_ylim()
        if low > 0 and high / low < 12:
            return f"{value:g}"
        lead = round(value / 10 ** math.floor(math.log10(value)))
        return f"{value:g}" if lead in (2, 5) else ""
    return label


def main(argv):
    if len(argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    csv_path, png_path = argv[1], argv[2]
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import FuncFormatter, ScalarFormatter
    except ImportError as e:
        print(f"plot_sweep.py: matplotlib is not available ({e}); "
              "install it with `python3 -m pip install matplotlib`", file=sys.stderr)
        return 3
    with open(csv_path, newline="") as f:
        rows = list(csv.DictReader(f))
    if not rows:
        print(f"plot_sweep.py: {csv_path} has no rows", file=sys.stderr)
        return 2
    kind = argv[3] if len(argv) > 3 and argv[3] else rows[0]["sweep"]
    title = argv[4] if len(argv) > 4 else ""
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
        p50 = [number(by_point[points[i]]["p50_ms"]) for i in xs]
        p99 = [number(by_point[points[i]]["p99_ms"]) for i in xs]
        tf = [number(by_point[points[i]]["tflops"]) for i in xs]
        # NaN (failed) points break the line instead of dropping it to 0.
        line, = ax_lat.plot(xs, p50, marker="o", label=f"{b} p50")
        ax_lat.plot(xs, p99, linestyle="--", color=line.get_color(), label=f"{b} p99")
        ax_tf.plot(xs, tf, marker="o", color=line.get_color(), label=b)
        failed = [i for i, v in zip(xs, p50) if math.isnan(v)]
        if failed:
            ax_lat.plot(failed, [0.02] * len(failed), linestyle="none", marker="x", markersize=9,
                        color=line.get_color(), transform=ax_lat.get_xaxis_transform(),
                        label=f"{b} failed")
    names = {"seq": "sequence length", "batch": "batch size", "heads": "head layout"}
    for ax in (ax_lat, ax_tf):
        ax.set_xticks(x)
        ax.set_xticklabels(points, rotation=20)
        ax.set_xlabel(names.get(kind, kind))
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    ax_lat.set_ylabel("latency (ms)")
    ax_lat.set_yscale("log")
    ax_lat.yaxis.set_major_formatter(FuncFormatter(plain))
    ax_lat.yaxis.set_minor_formatter(FuncFormatter(plain_minor(ax_lat)))
    ax_tf.set_ylabel("achieved TFLOP/s")
    tf_format = ScalarFormatter(useOffset=False)
    tf_format.set_scientific(False)
    ax_tf.yaxis.set_major_formatter(tf_format)
    head = f"attention-loadgen sweep: {names.get(kind, kind)}"
    fig.suptitle(title if title else head, fontsize=10, wrap=True)
    fig.tight_layout()
    fig.savefig(png_path, dpi=100)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
