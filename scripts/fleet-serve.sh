#!/usr/bin/env bash
# N idle `baton serve` processes (debug build, `cargo build -p baton-cli`) on a
# PostgreSQL database of their own: server connections and transactions/s
# per process, sampled for 30 s after SETTLE seconds (issue #23 item 2).
#   N=20 SETTLE=45 scripts/fleet-serve.sh
set -u
B=${B:-$(cd "$(dirname "$0")/.." && pwd)/target/debug/baton}
N=${N:-20}
DB=fleet20_$$
psql -h 127.0.0.1 -U postgres -d test -qc "CREATE DATABASE $DB" >/dev/null
dir=$(mktemp -d)
cat > $dir/baton.toml <<T
store = "postgres://postgres@127.0.0.1:5432/$DB"
[[queue]]
name = "default"
[[job]]
name = "hourly"
cron = "0 * * * *"
command = ["true"]
T
pids=()
for i in $(seq 1 $N); do
  (cd $dir && exec $B serve --config baton.toml >/dev/null 2>&1) & pids+=($!)
done
q() { psql -h 127.0.0.1 -U postgres -d test -tAc "$1"; }
sleep ${SETTLE:-60}
x0=$(q "SELECT xact_commit FROM pg_stat_database WHERE datname = '$DB'")
t0=$(date +%s.%N)
most=0; sum=0; n=0
for s in $(seq 1 30); do
  c=$(q "SELECT count(*) FROM pg_stat_activity WHERE datname = '$DB' AND application_name LIKE 'baton%'")
  [ "$c" -gt "$most" ] && most=$c; sum=$((sum + c)); n=$((n + 1))
  sleep 1
done
x1=$(q "SELECT xact_commit FROM pg_stat_database WHERE datname = '$DB'")
t1=$(date +%s.%N)
kill "${pids[@]}" 2>/dev/null; wait 2>/dev/null
python3 -c "
n=$N; secs=$t1-$t0; x=$x1-$x0
print(f'{n} idle serves, {secs:.1f} s: connections mean {$sum/$n/n:.2f} per process (max {$most} = {$most/n:.2f} per process); {x} transactions = {x/secs/n:.3f}/s per process')
"
q "DROP DATABASE $DB WITH (FORCE)" >/dev/null
rm -rf $dir
