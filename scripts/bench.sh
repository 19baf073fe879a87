#!/usr/bin/env bash
# Run baton's benchmark set on SQLite, PostgreSQL and Redis, together with the
# stores' own ceilings (redis-benchmark, pgbench) and graphile-worker, in one
# run so that ratios are measured side by side on the same (noisy) machine.
#
#   scripts/bench.sh                      # everything, REPS=3
#   SECTIONS="lock ceilings" REPS=5 scripts/bench.sh
#
# Results: $OUT/results.jsonl (one JSON object per measurement, with "rep"),
# $OUT/log.txt (human lines), $OUT/explain.txt (claim plans). Summarise with
# scripts/bench-summary.py $OUT/results.jsonl.
#
# graphile-worker is installed with npm into $GW_DIR (outside the repository)
# and runs in its own schema (graphile_worker) on the same PostgreSQL.
set -euo pipefail

cd "$(dirname "$0")/.."
REPS=${REPS:-3}
PG=${PG:-postgres://postgres@127.0.0.1:5432/test}
REDIS=${REDIS:-redis://127.0.0.1:6379}
JOBS=${JOBS:-200000}
LOCK_SECS=${LOCK_SECS:-10}
CEIL_SECS=${CEIL_SECS:-10}
POOL=${POOL:-20}                 # per worker process/handle; 4 x 20 fits max_connections=100
GW_DIR=${GW_DIR:-/tmp/gw}
GW_VERSION=${GW_VERSION:-0.16.6} # 0.17+/0.18 need Node >= 22
PRECISION_SECS=${PRECISION_SECS:-60}
SECTIONS=${SECTIONS:-"ceilings lock latency precision throughput claim"}
OUT=${OUT:-target/bench/$(date +%Y%m%d-%H%M%S)}
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)   # absolute: graphile runs from $GW_DIR
TMP=${TMPDIR:-/tmp}
BIN=target/release/baton-bench

mkdir -p "$OUT"
RESULTS="$OUT/results.jsonl"
LOG="$OUT/log.txt"

log() { echo "$*" | tee -a "$LOG" >&2; }

# record REP JSON: append one result line with the repetition number.
record() { jq -c --argjson rep "$1" '. + {rep: $rep}' <<<"$2" >>"$RESULTS"; }

sqlite_url() { echo "sqlite://$TMP/baton-bench-$$-$RANDOM.db"; }
sqlite_rm() { local f=${1#sqlite://}; rm -f "$f" "$f-wal" "$f-shm"; }
redis_clean() { redis-cli -u "$REDIS" --scan --pattern '*bench_*' | xargs -r -n 1000 redis-cli -u "$REDIS" unlink >/dev/null; }

# bench REP ARGS...: run baton-bench on the store URL given in ARGS, record it.
bench() {
  local rep=$1; shift
  local out
  out=$("$BIN" "$@" 2>>"$OUT/explain.txt")
  grep '^#' <<<"$out" | tee -a "$LOG" >&2
  while IFS= read -r line; do record "$rep" "$line"; done < <(grep '^{' <<<"$out")
}

# on_store REP STORE ARGS...: STORE is sqlite|postgres|redis.
on_store() {
  local rep=$1 st=$2; shift 2
  case $st in
    sqlite) local u; u=$(sqlite_url); bench "$rep" "$@" --store "$u"; sqlite_rm "$u" ;;
    postgres) bench "$rep" "$@" --store "$PG" ;;
    redis) bench "$rep" "$@" --store "$REDIS"; redis_clean ;;
  esac
}

cargo build --release -p baton-bench >&2

# ---- the stores' own ceilings --------------------------------------------------
ceilings() {
  local rep=$1 c line rps p50 tps lat
  local rhost rport
  rhost=$(sed -E 's#redis://([^:/]+).*#\1#' <<<"$REDIS")
  rport=$(sed -E 's#redis://[^:]+:([0-9]+).*#\1#' <<<"$REDIS")
  for c in 1 32; do
    line=$(redis-benchmark -h "$rhost" -p "$rport" -q -n 200000 -c "$c" -t set | tr '\r' '\n' | grep 'requests per second' | tail -1)
    rps=$(sed -E 's/.*SET: ([0-9.]+) requests per second.*/\1/' <<<"$line")
    p50=$(sed -nE 's/.*p50=([0-9.]+) msec.*/\1/p' <<<"$line")
    log "# redis-benchmark SET c=$c: $line"
    record "$rep" "$(jq -nc --argjson c "$c" --argjson rps "$rps" --arg p50 "${p50:-}" \
      '{bench:"ceiling", tool:"redis-benchmark", store:"redis", op:"SET", concurrency:$c, ops_per_s:$rps, p50_ms:($p50|tonumber? // null)}')"
  done
  psql "$PG" -qAtc "CREATE TABLE IF NOT EXISTS bench_upsert (k int PRIMARY KEY, v bigint NOT NULL)" >/dev/null
  local f="$OUT/upsert.sql"
  # One statement, one row per client (like the lock bench's one name per task).
  echo 'INSERT INTO bench_upsert (k, v) VALUES (:client_id, 1) ON CONFLICT (k) DO UPDATE SET v = bench_upsert.v + 1;' >"$f"
  for c in 1 32; do
    line=$(pgbench -n -M prepared -f "$f" -c "$c" -j 2 -T "$CEIL_SECS" "$PG" 2>&1)
    tps=$(sed -nE 's/^tps = ([0-9.]+) .*/\1/p' <<<"$line" | head -1)
    lat=$(sed -nE 's/^latency average = ([0-9.]+) ms/\1/p' <<<"$line")
    log "# pgbench upsert c=$c: tps $tps, latency avg $lat ms"
    record "$rep" "$(jq -nc --argjson c "$c" --argjson tps "$tps" --argjson lat "$lat" \
      '{bench:"ceiling", tool:"pgbench", store:"postgres", op:"upsert", concurrency:$c, ops_per_s:$tps, avg_ms:$lat}')"
  done
  psql "$PG" -qAtc "DROP TABLE IF EXISTS bench_upsert" >/dev/null
}

# ---- graphile-worker --------------------------------------------------------------
gw_install() {
  if [ ! -x "$GW_DIR/node_modules/.bin/graphile-worker" ]; then
    mkdir -p "$GW_DIR"
    (cd "$GW_DIR" && { [ -f package.json ] || npm init -y >/dev/null; } &&
      npm install --no-audit --no-fund "graphile-worker@$GW_VERSION" >&2)
  fi
  mkdir -p "$GW_DIR/tasks"
  # The perfTest's task, reduced to a no-op (as baton's handler).
  echo 'module.exports = async () => {};' >"$GW_DIR/tasks/log_if_999.js"
}

now_ms() { date +%s%3N; }

# graphile REP: the perfTest shape: startup time of one --once run on an empty
# queue, bulk insert of $JOBS jobs, then 4 processes x -j 24 --once; jobs/s =
# JOBS / (elapsed - startup).
graphile() {
  local rep=$1 gw="$GW_DIR/node_modules/.bin/graphile-worker" t0 t1 startup insert_ms drain_ms i
  psql "$PG" -qAtc "DROP SCHEMA IF EXISTS graphile_worker CASCADE" >/dev/null 2>&1
  (cd "$GW_DIR" && "$gw" -c "$PG" --schema-only >/dev/null)
  t0=$(now_ms); (cd "$GW_DIR" && "$gw" -c "$PG" --once -j 24 -m "$POOL" >/dev/null); t1=$(now_ms)
  startup=$((t1 - t0))
  t0=$(now_ms)
  psql "$PG" -qAtc "SELECT count(*) FROM graphile_worker.add_jobs(ARRAY(
      SELECT ROW('log_if_999', json_build_object('id', i), NULL, NULL, NULL, NULL, NULL, NULL)::graphile_worker.job_spec
      FROM generate_series(1, $JOBS) i))" >/dev/null
  t1=$(now_ms); insert_ms=$((t1 - t0))
  t0=$(now_ms)
  local pids=()
  for i in 1 2 3 4; do
    (cd "$GW_DIR" && NO_LOG_SUCCESS=1 "$gw" -c "$PG" --once -j 24 -m "$POOL" >/dev/null 2>>"$OUT/graphile.stderr") &
    pids+=($!)
  done
  for i in "${pids[@]}"; do wait "$i"; done
  t1=$(now_ms); drain_ms=$((t1 - t0))
  local left
  left=$(psql "$PG" -qAtc "SELECT count(*) FROM graphile_worker._private_jobs")
  local rate
  rate=$(jq -n "$JOBS * 1000 / ($drain_ms - $startup)")
  log "# graphile-worker $GW_VERSION: insert $JOBS in $insert_ms ms, drain $drain_ms ms - startup $startup ms => $rate jobs/s ($left left)"
  record "$rep" "$(jq -nc --argjson jobs "$JOBS" --argjson ins "$insert_ms" --argjson drain "$drain_ms" \
    --argjson st "$startup" --argjson rate "$rate" --argjson left "$left" --arg v "$GW_VERSION" \
    '{bench:"queue-throughput", store:"graphile-worker", version:$v, jobs:$jobs, workers:4, concurrency:24,
      insert_s:($ins/1000), insert_per_s:($jobs*1000/$ins), drain_s:($drain/1000), startup_s:($st/1000),
      jobs_per_s:$rate, jobs_left:$left}')"
  psql "$PG" -qAtc "DROP SCHEMA IF EXISTS graphile_worker CASCADE" >/dev/null 2>&1
}

# ---- the run -----------------------------------------------------------------------
log "# baton-bench run $(date -Is) on $(nproc) cores; REPS=$REPS JOBS=$JOBS; $(git rev-parse --short HEAD)"
has() { [[ " $SECTIONS " == *" $1 "* ]]; }
has throughput && gw_install

for rep in $(seq 1 "$REPS"); do
  log "## repetition $rep"
  if has ceilings; then ceilings "$rep"; fi
  if has lock; then
    for c in 1 32; do
      for st in sqlite postgres redis; do
        on_store "$rep" "$st" lock --concurrency "$c" --duration "$LOCK_SECS"
      done
    done
  fi
  if has latency; then
    for st in sqlite postgres redis; do
      on_store "$rep" "$st" latency --jobs 1000
    done
  fi
  if has precision; then
    # 3 instances (scheduler + worker each), a 1 s durable job for 60 s.
    for st in sqlite postgres redis; do
      on_store "$rep" "$st" schedule-precision --instances 3 --seconds "$PRECISION_SECS" --pool 4
    done
  fi
  if has throughput; then
    # baton on PostgreSQL and graphile-worker back to back, same pool size.
    on_store "$rep" postgres queue-throughput --jobs "$JOBS" --workers 4 --concurrency 24 --pool "$POOL"
    graphile "$rep"
    on_store "$rep" sqlite queue-throughput --jobs "$JOBS" --workers 4 --concurrency 24 --pool "$POOL"
    on_store "$rep" redis queue-throughput --jobs "$JOBS" --workers 4 --concurrency 24 --pool "$POOL"
  fi
done

# Claim scaling: one bulk insert per (store, size), then REPS rounds of 10 s
# per phase inside one process (PostgreSQL: without statistics, then after
# ANALYZE).
if has claim; then
  for pending in 10000 1000000; do
    for st in sqlite postgres redis; do
      on_store 0 "$st" claim-scale --pending "$pending" --rounds "$REPS" --duration 10 --analyze both --explain
    done
  done
fi
log "# results in $RESULTS"
