#!/usr/bin/env bash
# Issue 28's check, side by side: per round, the store's own ceiling for
# the queue's work (`baton-bench ceiling`), then `queue-throughput` of each
# build, alternating, so every build is measured against the same round's
# ceiling. Prints one line a run; `summary` prints the median of the
# per-round ratios.
#
#   STORE=postgres://postgres@127.0.0.1:5496/test JOBS=200000 ROUNDS=4 \
#     scripts/bench-ceiling-ab.sh "ceiling|" "base|" "new|--prefetch 512"
#   OUT=... scripts/bench-ceiling-ab.sh summary
#
# Each argument is `name|extra arguments`: `ceiling` runs the ceiling (with
# the first build's binary; a name starting `ceiling`, e.g.
# `ceiling-rc|--shape rc`, runs it with its extra arguments: ratios are
# to the one named `ceiling`), any other name runs /tmp/bb-NAME/baton-bench
# (BB_DIR overrides /tmp) with the extra arguments. On a PostgreSQL server
# on this machine (the URL's port) each line also says the server's CPU a
# task (the postmaster's reaped children's user + system ticks, which
# count a backend's time once it exits: the bench's connections close at
# its end; on MySQL/MariaDB the server process's own), and the WAL it
# wrote (bytes and full-page images a task) and the checkpoints that began
# during the run, from `pg_stat_wal` and `pg_stat_bgwriter`: a checkpoint inside a run makes the pages it touches
# next write whole images to the WAL. PG_CHECKPOINT=1 runs `CHECKPOINT`
# before each run, so no run pays for the WAL of the one before it (with
# max_wal_size's default 1 GB a checkpoint starts every ~2 runs of 200k).
set -u
OUT=${OUT:-target/bench/ceiling-ab.jsonl}
if [ "${1:-}" = summary ]; then
  exec python3 - "$OUT" <<'PY'
import json, statistics, sys, collections
rounds = collections.defaultdict(dict)
for line in open(sys.argv[1]):
    try:
        d = json.loads(line)
    except ValueError:
        continue
    if d.get("jobs_per_s"):
        rounds[d["round"]][d["name"]] = d
names = []
for r in rounds.values():
    for n in r:
        if n not in names:
            names.append(n)
print("| build | runs | jobs/s (median) | ÷ ceiling (median of rounds) | range |")
print("|---|---|---|---|---|")
for n in names:
    js = [r[n]["jobs_per_s"] for r in rounds.values() if n in r]
    ratios = [r[n]["jobs_per_s"] / r["ceiling"]["jobs_per_s"] for r in rounds.values() if n in r and "ceiling" in r]
    rng = "%.2f-%.2f" % (min(ratios), max(ratios)) if ratios else "-"
    print("| %s | %d | %.0f | %.2f | %s |" % (n, len(js), statistics.median(js), statistics.median(ratios) if ratios else 0, rng))
PY
fi
STORE=${STORE:?STORE: the store URL (sqlite: a fresh file under /tmp each run)}
sqlite_file=""
if [ "$STORE" = sqlite ]; then
  sqlite_file=/tmp/baton-bench-ab.db
  STORE=sqlite://$sqlite_file
fi
JOBS=${JOBS:-200000}
ROUNDS=${ROUNDS:-4}
BB_DIR=${BB_DIR:-/tmp}
mkdir -p "$(dirname "$OUT")"
first=""
for spec in "$@"; do
  n=${spec%%|*}
  [[ "$n" != ceiling* ]] && [ -z "$first" ] && first=$n
done
pg=""
case $STORE in
  postgres://*)
    port=$(printf '%s' "$STORE" | sed -E 's#.*@[^:/]+:([0-9]+)/.*#\1#')
    [ "$port" = "$STORE" ] && port=5432
    pm=$(pgrep -f "postgres.*-p $port" -o 2>/dev/null || true)
    [ -z "$pm" ] && pm=$(ss -ltnpH "sport = :$port" 2>/dev/null | grep -o 'pid=[0-9]*' | head -1 | cut -d= -f2)
    pg=1
    ;;
  mysql://*)
    # MariaDB/MySQL: one process, its threads' time is its own.
    pm=$(pgrep -o -x mariadbd 2>/dev/null || pgrep -o -x mysqld 2>/dev/null || true)
    ;;
esac
# A server's CPU ticks: PostgreSQL's exited backends (reaped children),
# MySQL's own threads.
ticks() {
  if [ -n "$pg" ]; then awk '{print $16 + $17}' "/proc/$pm/stat"; else awk '{print $14 + $15}' "/proc/$pm/stat"; fi
}
stats() {
  psql "$STORE" -tAc "SELECT w.wal_bytes, w.wal_fpi, b.checkpoints_timed + b.checkpoints_req
    FROM pg_stat_wal w, pg_stat_bgwriter b" 2>/dev/null | tr '|' ' '
}
hz=$(getconf CLK_TCK)
for round in $(seq 1 "$ROUNDS"); do
  for spec in "$@"; do
    name=${spec%%|*}
    extra=${spec#*|}
    [ "$extra" = "$spec" ] && extra=""
    if [[ "$name" == ceiling* ]]; then
      # shellcheck disable=SC2206
      cmd=("$BB_DIR/bb-$first/baton-bench" ceiling --store "$STORE" --jobs "$JOBS" $extra)
    else
      # shellcheck disable=SC2206
      cmd=("$BB_DIR/bb-$name/baton-bench" queue-throughput --store "$STORE" --jobs "$JOBS" $extra)
    fi
    if [ -n "$pg" ] && [ "${PG_CHECKPOINT:-}" = 1 ]; then psql "$STORE" -qtAc CHECKPOINT; fi
    if [ -n "${pm:-}" ]; then t0=$(ticks); fi
    if [ -n "$pg" ] && [ -n "$pm" ]; then read -r wb0 fpi0 ck0 <<<"$(stats)"; fi
    [ -n "$sqlite_file" ] && rm -f "$sqlite_file"*
    line=$(/usr/bin/time -f '%U %S' -o /tmp/bench-ab.time "${cmd[@]}" 2>/dev/null | grep '^{' | tail -1)
    jps=$(printf '%s' "$line" | python3 -c 'import json,sys; t=sys.stdin.read(); print(json.loads(t)["jobs_per_s"] if t else 0)')
    read -r cu cs <<<"$(tail -n1 /tmp/bench-ab.time)"
    if [ -z "$line" ]; then
      echo "$round $name failed: ${cmd[*]}"
      continue
    fi
    client=$(python3 -c "print(round(($cu + $cs) * 1e6 / $JOBS, 1))")
    srv=null wal=null fpi=null ck=null
    if [ -n "${pm:-}" ]; then
      t1=$(ticks)
      srv=$(python3 -c "print(round(($t1 - $t0) / $hz * 1e6 / $JOBS, 1))")
    fi
    if [ -n "$pg" ] && [ -n "$pm" ]; then
      read -r wb1 fpi1 ck1 <<<"$(stats)"
      wal=$(python3 -c "print(round(($wb1 - $wb0) / $JOBS))")
      fpi=$(python3 -c "print(round(($fpi1 - $fpi0) / $JOBS, 3))")
      ck=$((ck1 - ck0))
    fi
    echo "{\"round\":$round,\"name\":\"$name\",\"jobs_per_s\":$jps,\"client_us\":$client,\"server_us\":$srv,\"wal_bytes\":$wal,\"wal_fpi\":$fpi,\"checkpoints\":$ck}" >> "$OUT"
    echo "$round $name $jps client_us=$client srv_us=$srv wal_b=$wal fpi=$fpi ckpt=$ck"
  done
done
