#!/usr/bin/env bash
# CI's PgBouncer step: the whole conformance suite's PostgreSQL tests through
# a private PgBouncer in transaction mode (started here on a free loopback
# port, in front of $BATON_TEST_POSTGRES's server), with wake-ups LISTENing
# on the direct connection (`listen_port`). Exits non-zero on any failure.
#
#   scripts/pgbouncer-ci.sh [extra cargo test filter args]
set -euo pipefail
cd "$(dirname "$0")/.."

upstream=${BATON_TEST_POSTGRES:-postgres://postgres@127.0.0.1:5432/test}
rest=${upstream#*://}
rest=${rest%%\?*}
user=${rest%%@*}; user=${user%%:*}
hostdb=${rest#*@}
hostport=${hostdb%%/*}
db=${hostdb#*/}
host=${hostport%%:*}
port=${hostport##*:}; [ "$port" = "$hostport" ] && port=5432

dir=$(mktemp -d /tmp/baton-pgbouncer.XXXXXX)
chmod 777 "$dir"
listen=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
printf '"%s" ""\n' "$user" > "$dir/users.txt"
cat > "$dir/pgbouncer.ini" <<INI
[databases]
$db = host=$host port=$port dbname=$db
[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $listen
auth_type = trust
auth_file = $dir/users.txt
pool_mode = transaction
max_client_conn = 1000
default_pool_size = 60
unix_socket_dir =
logfile = $dir/pgbouncer.log
log_connections = 0
log_disconnections = 0
INI
chmod 666 "$dir"/*
as=()
[ "$(id -u)" = 0 ] && as=(-u postgres)
# -q: its log goes to $dir/pgbouncer.log only, not to CI's output.
pgbouncer -q "${as[@]}" "$dir/pgbouncer.ini" &
pid=$!
trap 'kill $pid 2>/dev/null || true' EXIT
for _ in $(seq 1 50); do
  (exec 3<>/dev/tcp/127.0.0.1/$listen) 2>/dev/null && break
  sleep 0.1
done
echo "pgbouncer $(pgbouncer --version | head -n1) on 127.0.0.1:$listen (transaction mode) in front of $host:$port/$db"
BATON_TEST_POSTGRES="postgres://$user@127.0.0.1:$listen/$db?pool_mode=transaction&listen_port=$port" \
  cargo test --workspace --test conformance "${@:-postgres::}"
