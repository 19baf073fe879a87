#!/usr/bin/env bash
# Queue throughput, variants alternating per repetition, with the client's
# CPU time and, on PostgreSQL, the whole server's WAL bytes per run (other
# clients' writes included, so an upper bound). STORE picks the store
# (default $PG; e.g. STORE=redis://127.0.0.1:6379 or STORE=sqlite:///tmp/ab.db).
#
#   JOBS=50000 scripts/bench-ab.sh OUT.txt 2 "pipeline|" "delete|--delete-succeeded" \
#     "base|--hold-slots --result-batches 1"
set -euo pipefail
out=$1 reps=$2; shift 2
PG=${PG:-postgres://postgres@127.0.0.1:5432/test}
STORE=${STORE:-$PG}
BIN=${BATON_BENCH:-target/release/baton-bench}
wal_lsn() { case $STORE in postgres*) psql "$STORE" -qAtc "SELECT pg_current_wal_lsn()" ;; *) echo - ;; esac; }
for r in $(seq 1 "$reps"); do
  for v in "$@"; do
    label=${v%%|*} args=${v#*|}
    lsn0=$(wal_lsn)
    # shellcheck disable=SC2086
    res=$(/usr/bin/time -f "# client cpu: user %U s sys %S s wall %e s" "$BIN" queue-throughput \
      --store "$STORE" --jobs "${JOBS:-100000}" --workers 4 --concurrency 24 --pool 20 $args 2>&1)
    wal=-
    [ "$lsn0" = - ] || wal=$(psql "$STORE" -qAtc "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '$lsn0')")
    echo "rep=$r $label :: $(grep '^{' <<<"$res" | jq -c '{jobs_per_s, drain_s, hold_slots, result_batches, prefetch}') $(grep '^# client' <<<"$res") wal_bytes=$wal" | tee -a "$out"
  done
done
