#!/usr/bin/env python3
"""Summarise scripts/bench.sh results (results.jsonl) as Markdown tables:
median (min-max) over repetitions, and per-repetition ratios measured side
by side. Usage: scripts/bench-summary.py target/bench/<run>/results.jsonl"""
import json
import statistics
import sys
from collections import defaultdict


def load(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def fmt(xs, digits=0):
    xs = [x for x in xs if x is not None]
    if not xs:
        return "-"
    m = statistics.median(xs)
    f = f"{{:.{digits}f}}"
    return f"{f.format(m)} ({f.format(min(xs))}–{f.format(max(xs))})"


def per_rep_ratios(by, key_a, key_b, field):
    """a/b for each repetition that has both measurements."""
    a = {r["rep"]: r[field] for r in by.get(key_a, [])}
    b = {r["rep"]: r[field] for r in by.get(key_b, [])}
    return [a[i] / b[i] for i in a if i in b and b[i]]


def main():
    rows = load(sys.argv[1])
    by = defaultdict(list)
    for r in rows:
        b = r["bench"]
        if b == "ceiling":
            by[("ceiling", r["tool"], r["concurrency"])].append(r)
        elif b == "lock":
            by[("lock", r["store"], r["concurrency"])].append(r)
        elif b == "latency":
            by[("latency", r["store"])].append(r)
        elif b == "queue-throughput":
            # A run of $BASE_BENCH (old build) is its own row: "<store> (base)".
            store = r["store"] + (" (base)" if r.get("build") == "base" else "")
            by[("tp-incomplete" if r.get("incomplete") else "tp", store)].append(r)
        elif b == "claim-scale":
            by[("claim", r["store"], r["pending"], r["phase"])].append(r)
        elif b == "schedule_precision":
            by[("precision", r["store"])].append(r)

    print("### Store ceilings\n")
    print("| tool | concurrency | ops/s median (min–max) | latency ms (redis-benchmark p50, pgbench/mysqlslap average) |")
    print("|---|---|---|---|")
    for k in sorted(k for k in by if k[0] == "ceiling"):
        lat = [r.get("p50_ms", r.get("avg_ms")) for r in by[k]]
        print(f"| {k[1]} | {k[2]} | {fmt([r['ops_per_s'] for r in by[k]])} | {fmt(lat, 3)} |")

    print("\n### Locks (acquire+release on distinct names, Locker, keep-alive off)\n")
    print("| store | concurrency | acquire+release/s | cycle p50 ms | cycle p99 ms | acquire p50 ms | release p50 ms |")
    print("|---|---|---|---|---|---|---|")
    for k in sorted(k for k in by if k[0] == "lock"):
        rs = by[k]

        def op(r, what):
            return r.get(what, {}).get("p50_ms")
        print(f"| {k[1]} | {k[2]} | {fmt([r['ops_per_s'] for r in rs])} | "
              f"{fmt([r['latency']['p50_ms'] for r in rs], 3)} | "
              f"{fmt([r['latency']['p99_ms'] for r in rs], 3)} | "
              f"{fmt([op(r, 'acquire_latency') for r in rs], 3)} | "
              f"{fmt([op(r, 'release_latency') for r in rs], 3)} |")

    print("\n### Lock vs store ceiling, per repetition (same run)\n")
    print("| store | c | cycles / ceiling op | round trips (2 per cycle) / ceiling op |")
    print("|---|---|---|---|")
    for store, tool in (("redis", "redis-benchmark"), ("postgres", "pgbench"), ("mysql", "mysqlslap")):
        for c in (1, 32):
            ratios = per_rep_ratios(by, ("lock", store, c), ("ceiling", tool, c), "ops_per_s")
            print(f"| {store} vs {tool} | {c} | {fmt([x * 100 for x in ratios], 1)} % | "
                  f"{fmt([x * 200 for x in ratios], 1)} % |")

    print("\n### Enqueue → handler start (one idle worker, sequential)\n")
    print("| store | p50 ms | p99 ms | enqueue call p50 ms |")
    print("|---|---|---|---|")
    for k in sorted(k for k in by if k[0] == "latency"):
        rs = by[k]
        print(f"| {k[1]} | {fmt([r['enqueue_to_start']['p50_ms'] for r in rs], 3)} | "
              f"{fmt([r['enqueue_to_start']['p99_ms'] for r in rs], 3)} | "
              f"{fmt([r['enqueue_call']['p50_ms'] for r in rs], 3)} |")

    print("\n### Queue throughput (pre-insert, then 4 workers × 24)\n")
    print("| store | jobs/s | insert/s |")
    print("|---|---|---|")
    for k in sorted(k for k in by if k[0] == "tp"):
        rs = by[k]
        print(f"| {k[1]} | {fmt([r['jobs_per_s'] for r in rs])} | {fmt([r['insert_per_s'] for r in rs])} |")
    for k in sorted(k for k in by if k[0] == "tp-incomplete"):
        for r in by[k]:
            print(f"| {k[1]} (repetition {r['rep']}) | gave up after {r['drain_s'] if 'drain_s' in r else '?'} s: "
                  f"{r['left']} of {r['jobs']} left ({r['done_per_s']:.0f} done/s) | |")
    pairs = [("postgres", "graphile-worker"), ("postgres", "pg-boss"), ("redis", "bullmq"),
             ("mysql", "apalis-mysql"),
             ("postgres", "postgres (base)"), ("redis", "redis (base)"), ("sqlite", "sqlite (base)")]
    for a, b in pairs:
        ratios = per_rep_ratios(by, ("tp", a), ("tp", b), "jobs_per_s")
        if ratios:
            print(f"\nbaton {a} / {b}, per repetition: {[round(x, 2) for x in ratios]}, "
                  f"median {fmt(ratios, 2)}")
    # PostgreSQL goal: against the faster of the two peers in each repetition.
    pg = {r["rep"]: r["jobs_per_s"] for r in by.get(("tp", "postgres"), [])}
    peers = defaultdict(list)
    for b in ("graphile-worker", "pg-boss"):
        for r in by.get(("tp", b), []):
            peers[r["rep"]].append(r["jobs_per_s"])
    best = [pg[i] / max(peers[i]) for i in pg if peers.get(i)]
    if best:
        print(f"\nbaton postgres / the faster PostgreSQL peer, per repetition: "
              f"{[round(x, 2) for x in best]}, median {fmt(best, 2)}")

    print("\n### Claim scaling (4 claimers × batch 10, each task finished)\n")
    print("| store | pending | statistics | claimed+finished/s, rounds median (min–max) | claim p50 ms | claim p99 ms | insert/s |")
    print("|---|---|---|---|---|---|---|")
    med = {}
    for k in sorted((k for k in by if k[0] == "claim"), key=lambda k: (k[1], k[3], k[2])):
        for r in by[k]:
            rates = [x["claimed_per_s"] for x in r["rounds"]]
            med[(k[1], k[2], k[3])] = statistics.median(rates)
            print(f"| {k[1]} | {k[2]} | {k[3]} | {fmt(rates)} | "
                  f"{fmt([x['claim_latency']['p50_ms'] for x in r['rounds']], 3)} | "
                  f"{fmt([x['claim_latency']['p99_ms'] for x in r['rounds']], 3)} | "
                  f"{r['insert_per_s']:.0f} |")
    print()
    for (store, pending, phase), v in sorted(med.items()):
        if pending == 1000000 and (store, 10000, phase) in med:
            print(f"- {store} {phase}: 1M / 10k = {v / med[(store, 10000, phase)] * 100:.0f} %")

    print("\n### Schedule precision (instances x 1 s durable job)\n")
    print("| store | slots | slot->start p50 ms | p99 ms | skipped | missed | doubled |")
    print("|---|---|---|---|---|---|---|")
    for k in sorted(k for k in by if k[0] == "precision"):
        rs = by[k]
        print(f"| {k[1]} | {sum(r['slots'] for r in rs)} | "
              f"{fmt([r['slot_to_start']['p50_ms'] for r in rs], 3)} | "
              f"{fmt([r['slot_to_start']['p99_ms'] for r in rs], 3)} | "
              f"{sum(r['skipped'] for r in rs)} | {sum(r['missed'] for r in rs)} | "
              f"{sum(r['doubled'] for r in rs)} |")


if __name__ == "__main__":
    main()
