#!/usr/bin/env bash
# Scaling curves (issue 28 item 3): baton's no-op queue throughput against
# worker instances, against concurrency per worker, and against the
# pending backlog, each point run beside the store's own ceiling
# (`baton-bench ceiling`, the same tasks and schema) in the same
# repetition, alternating. Writes one JSON line per measurement to
# $OUT/results.jsonl, tagged with "curve" and "x"; plot with
#   scripts/bench-scaling-plots.py docs $OUT/results.jsonl
#
#   STORES="postgres://postgres@127.0.0.1:5432/test redis://127.0.0.1:6379" \
#   REPS=3 JOBS=50000 BACKLOGS="10000 1000000" scripts/bench-scaling.sh
#
# Worker instances are `queue-throughput --workers N` (each its own store
# handle and pool, all in the bench's one process); the ceiling's
# `--clients` follows N on the workers curve; an empty WORKERS, CONC or
# BACKLOGS skips that curve. Keep runs short on a shared
# machine: every point is a full insert and drain.
set -euo pipefail
BIN=${BIN:-target/release/baton-bench}
OUT=${OUT:-target/bench/scaling-$(date +%Y%m%d-%H%M%S)}
STORES=${STORES:-postgres://postgres@127.0.0.1:5432/test}
REPS=${REPS:-3}
JOBS=${JOBS:-50000}
WORKERS=${WORKERS-"1 2 4 8"}
CONC=${CONC-"6 12 24 48"}
BACKLOGS=${BACKLOGS-"10000 1000000"}
mkdir -p "$OUT"
RES="$OUT/results.jsonl"

# run CURVE X STORE ARGS...: one measurement, tagged, appended to $RES.
run() {
  local curve=$1 x=$2 store=$3
  shift 3
  local line
  if ! line=$("$BIN" "$@" --store "$store" | grep '^{'); then
    echo "failed: $curve $x $store $*" >&2
    return 0
  fi
  local load
  load=$(cut -d' ' -f1 /proc/loadavg)
  python3 -c 'import json,sys; d=json.loads(sys.argv[1]); d.update(curve=sys.argv[2], x=int(sys.argv[3]), load=float(sys.argv[4])); print(json.dumps(d))' \
    "$line" "$curve" "$x" "$load" | tee -a "$RES"
}

for rep in $(seq "$REPS"); do
  for s in $STORES; do
    for w in $WORKERS; do
      run workers "$w" "$s" ceiling --jobs "$JOBS" --clients "$w" --batch 500
      run workers "$w" "$s" queue-throughput --jobs "$JOBS" --workers "$w" --concurrency 24
    done
    for c in $CONC; do
      # The ceiling has no concurrency: its point is the same at every x.
      run concurrency "$c" "$s" ceiling --jobs "$JOBS" --clients 4 --batch 500
      run concurrency "$c" "$s" queue-throughput --jobs "$JOBS" --workers 4 --concurrency "$c"
    done
    for b in $BACKLOGS; do
      run backlog "$b" "$s" ceiling --jobs "$b" --clients 4 --batch 500
      run backlog "$b" "$s" queue-throughput --jobs "$b" --workers 4 --concurrency 24
    done
  done
done
echo "results: $RES"
