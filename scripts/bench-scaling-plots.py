#!/usr/bin/env python3
"""Plots of scripts/bench-scaling.sh results, as SVG next to docs/BENCHMARKS.md.

    scripts/bench-scaling-plots.py OUT_DIR RESULTS.jsonl [RESULTS.jsonl ...]

Writes scaling-workers.svg, scaling-concurrency.svg and scaling-backlog.svg:
per store, baton's queue throughput (solid) beside the store's own ceiling
(dashed) at each point, the median of the repetitions with min-max
whiskers, and prints the table of medians and baton / ceiling.

Needs matplotlib (`pip install matplotlib`).
"""
import importlib.util
import pathlib
import statistics
import sys
from collections import defaultdict

import matplotlib

matplotlib.use("svg")
import matplotlib.pyplot as plt  # noqa: E402

CURVES = [
    ("workers", "worker instances (ceiling: clients)", False),
    ("concurrency", "concurrency per worker (4 workers)", False),
    ("backlog", "pending backlog (tasks)", True),
]


# The JSON-lines reader of scripts/bench-plots.py (which also sets the
# SVG backend).
_spec = importlib.util.spec_from_file_location(
    "bench_plots", pathlib.Path(__file__).with_name("bench-plots.py"))
_plots = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_plots)
load = _plots.load


def curve(rows, out, name, xlabel, logx):
    by = defaultdict(lambda: defaultdict(list))
    for r in rows:
        if r.get("curve") == name:
            by[(r["store"], r["bench"])][r["x"]].append(r["jobs_per_s"])
    if not by:
        return
    fig, ax = plt.subplots(figsize=(8, 4))
    for (store, bench), pts in sorted(by.items()):
        xs = sorted(pts)
        med = [statistics.median(pts[x]) for x in xs]
        lo = [m - min(pts[x]) for m, x in zip(med, xs)]
        hi = [max(pts[x]) - m for m, x in zip(med, xs)]
        style = "--" if bench == "ceiling" else "-"
        label = f"{store}: {'ceiling' if bench == 'ceiling' else 'baton'}"
        ax.errorbar(xs, med, yerr=[lo, hi], fmt=style + "o", capsize=3, label=label)
    if logx:
        ax.set_xscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel("jobs/s (median, min-max)")
    ax.set_title(f"No-op queue throughput against {name}, beside the store's ceiling")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(f"{out}/scaling-{name}.svg")
    plt.close(fig)
    print(f"| {name} | store | x | baton jobs/s | ceiling jobs/s | baton / ceiling |")
    print("|---|---|---|---|---|---|")
    stores = sorted({s for s, _ in by})
    for store in stores:
        b, c = by.get((store, "queue-throughput"), {}), by.get((store, "ceiling"), {})
        for x in sorted(set(b) | set(c)):
            mb = statistics.median(b[x]) if x in b else None
            mc = statistics.median(c[x]) if x in c else None
            ratio = f"{mb / mc:.2f}" if mb and mc else "-"
            print(f"| {name} | {store} | {x} | {mb or '-'} | {mc or '-'} | {ratio} |")


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    rows = load(sys.argv[2:])
    for name, xlabel, logx in CURVES:
        curve(rows, sys.argv[1], name, xlabel, logx)


if __name__ == "__main__":
    main()
