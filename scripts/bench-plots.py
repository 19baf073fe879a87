#!/usr/bin/env python3
"""Plots of scripts/bench.sh results, as SVG next to docs/BENCHMARKS.md.

    scripts/bench-plots.py OUT_DIR RESULTS.jsonl [RESULTS.jsonl ...]

Writes, for whatever the files hold:

- throughput.svg: queue throughput per system (median of the repetitions,
  whiskers min-max), baton beside its peers on each store;
- latency.svg: enqueue -> handler start and scheduled slot -> handler start,
  p50 / p90 / p99 / max per store (log scale);
- claim-scaling.svg: claimed+finished per second at each backlog size.

Needs matplotlib (`pip install matplotlib`).
"""
import json
import statistics
import sys
from collections import defaultdict

import matplotlib

matplotlib.use("svg")
import matplotlib.pyplot as plt  # noqa: E402

# Which store each system runs on, in display order.
SYSTEMS = [
    ("postgres", "baton", "postgres"),
    ("postgres", "graphile-worker", "graphile-worker"),
    ("postgres", "pg-boss", "pg-boss"),
    ("redis", "baton", "redis"),
    ("redis", "BullMQ", "bullmq"),
    ("mysql", "baton", "mysql"),
    ("mysql", "apalis-mysql", "apalis-mysql"),
    ("sqlite", "baton", "sqlite"),
]
BATON = "#2b6cb0"
PEER = "#a0aec0"


def load(paths):
    rows = []
    for p in paths:
        with open(p) as f:
            rows += [json.loads(line) for line in f if line.strip()]
    return rows


def throughput(rows, out):
    by = defaultdict(list)
    unfinished = set()
    for r in rows:
        if r.get("bench") != "queue-throughput" or r.get("build") == "base":
            continue
        if r.get("incomplete"):
            # A peer that did not finish in the bench's time: what it did
            # finish per second, drawn hatched.
            unfinished.add(r["store"])
            by[r["store"]].append(r["done_per_s"])
        else:
            by[r["store"]].append(r["jobs_per_s"])
    bars = [(st, name + (" *" if key in unfinished else ""), by[key])
            for st, name, key in SYSTEMS if by.get(key)]
    if not bars:
        return
    fig, ax = plt.subplots(figsize=(8, 4))
    xs = range(len(bars))
    med = [statistics.median(v) for _, _, v in bars]
    lo = [m - min(v) for m, (_, _, v) in zip(med, bars)]
    hi = [max(v) - m for m, (_, _, v) in zip(med, bars)]
    colors = [BATON if n == "baton" else PEER for _, n, _ in bars]
    ax.bar(xs, med, yerr=[lo, hi], color=colors, capsize=3)
    ax.set_xticks(list(xs), [f"{n}\n({st})" for st, n, _ in bars], fontsize=8)
    if unfinished:
        ax.annotate("* did not finish: tasks done per second until the bench gave up",
                    (0.01, 0.97), xycoords="axes fraction", va="top", fontsize=7)
    ax.set_ylabel("jobs/s (median, min-max)")
    lo_n, hi_n = min(len(v) for _, _, v in bars), max(len(v) for _, _, v in bars)
    reps = f"{lo_n}" if lo_n == hi_n else f"{lo_n}-{hi_n}"
    ax.set_title(f"Queue throughput: 200k no-op jobs, 4 workers x 24, {reps} repetitions")
    for x, m in zip(xs, med):
        ax.text(x, m, f"{m / 1000:.1f}k", ha="center", va="bottom", fontsize=8)
    fig.tight_layout()
    fig.savefig(f"{out}/throughput.svg")
    plt.close(fig)


def latency(rows, out):
    series = []
    for bench, key, label in (("latency", "enqueue_to_start", "enqueue -> start"),
                              ("schedule_precision", "slot_to_start", "slot -> start")):
        by = defaultdict(list)
        for r in rows:
            if r.get("bench") == bench and key in r:
                by[r["store"]].append(r[key])
        for store in sorted(by):
            pts = [statistics.median(s[p] for s in by[store]) for p in ("p50_ms", "p90_ms", "p99_ms", "max_ms")]
            series.append((f"{label}, {store}", pts))
    if not series:
        return
    fig, ax = plt.subplots(figsize=(8, 4))
    for label, pts in series:
        style = "-o" if label.startswith("enqueue") else "--s"
        ax.plot(["p50", "p90", "p99", "max"], pts, style, label=label)
    ax.set_yscale("log")
    ax.set_ylabel("ms (median of repetitions)")
    ax.set_title("Latency distribution: enqueue -> handler start, scheduled slot -> handler start")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(f"{out}/latency.svg")
    plt.close(fig)


def claim_scaling(rows, out):
    by = defaultdict(list)
    for r in rows:
        if r.get("bench") == "claim-scale":
            rates = [x["claimed_per_s"] for x in r["rounds"]]
            by[(r["store"], r["phase"])].append((r["pending"], statistics.median(rates)))
    if not by:
        return
    fig, ax = plt.subplots(figsize=(8, 4))
    for (store, phase), pts in sorted(by.items()):
        pts.sort()
        ax.plot([p for p, _ in pts], [v for _, v in pts], "-o", label=f"{store} ({phase})")
    ax.set_xscale("log")
    ax.set_xlabel("pending tasks (backlog)")
    ax.set_ylabel("claimed+finished/s")
    ax.set_title("Claim rate by backlog size")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(f"{out}/claim-scaling.svg")
    plt.close(fig)


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    rows = load(sys.argv[2:])
    for plot in (throughput, latency, claim_scaling):
        plot(rows, sys.argv[1])


if __name__ == "__main__":
    main()
