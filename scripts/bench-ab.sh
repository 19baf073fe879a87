#!/usr/bin/env bash
# PostgreSQL queue throughput, variants alternating per repetition, with the
# client's CPU time and the whole server's WAL bytes per run (other clients'
# writes included, so an upper bound).
#
#   JOBS=50000 scripts/bench-ab.sh OUT.txt 2 "pipeline|" "delete|--delete-succeeded" \
#     "base|--hold-slots --result-batches 1"
set -euo pipefail
out=$1 reps=$2; shift 2
PG=${PG:-postgres://postgres@127.0.0.1:5432/test}
BIN=${BATON_BENCH:-target/release/baton-bench}
for r in $(seq 1 "$reps"); do
  for v in "$@"; do
    label=${v%%|*} args=${v#*|}
    lsn0=$(psql "$PG" -qAtc "SELECT pg_current_wal_lsn()")
    # shellcheck disable=SC2086
    res=$(/usr/bin/time -f "# client cpu: user %U s sys %S s wall %e s" "$BIN" queue-throughput \
      --store "$PG" --jobs "${JOBS:-100000}" --workers 4 --concurrency 24 --pool 20 $args 2>&1)
    wal=$(psql "$PG" -qAtc "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '$lsn0')")
    echo "rep=$r $label :: $(grep '^{' <<<"$res" | jq -c '{jobs_per_s, drain_s}') $(grep '^# client' <<<"$res") wal_bytes=$wal" | tee -a "$out"
  done
done
