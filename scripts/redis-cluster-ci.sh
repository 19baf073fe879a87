#!/usr/bin/env bash
# CI's Redis Cluster step: the conformance suite's Redis tests on a private
# 3-node Redis Cluster (3 masters, no replicas), started here on free
# loopback ports (each with its bus port, port + 10000, free too) and
# killed on exit. Exits non-zero on any failure.
#
#   scripts/redis-cluster-ci.sh [extra cargo test filter args]
set -euo pipefail
cd "$(dirname "$0")/.."

dir=$(mktemp -d /tmp/baton-redis-cluster.XXXXXX)
# Three ports p with p and p + 10000 both free on loopback.
read -r -a ports <<<"$(python3 - <<'PY'
import random, socket
def free(p):
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", p)); return True
    except OSError:
        return False
    finally:
        s.close()
out = []
while len(out) < 3:
    p = random.randint(20000, 55000)
    if p not in out and free(p) and free(p + 10000):
        out.append(p)
print(*out)
PY
)"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$dir"
}
trap cleanup EXIT
for p in "${ports[@]}"; do
  mkdir -p "$dir/$p"
  redis-server --port "$p" --bind 127.0.0.1 --cluster-enabled yes \
    --cluster-config-file "$dir/$p/nodes.conf" --dir "$dir/$p" \
    --save '' --appendonly no --daemonize no --logfile "$dir/$p/log" &
  pids+=($!)
done
for p in "${ports[@]}"; do
  for _ in $(seq 1 50); do
    redis-cli -p "$p" ping >/dev/null 2>&1 && break
    sleep 0.1
  done
done
redis-cli --cluster create "${ports[@]/#/127.0.0.1:}" --cluster-replicas 0 --cluster-yes >"$dir/create.log" 2>&1 \
  || { cat "$dir/create.log"; exit 1; }
for _ in $(seq 1 100); do
  ok=1
  for p in "${ports[@]}"; do
    redis-cli -p "$p" cluster info | grep -q '^cluster_state:ok' || ok=0
  done
  [ $ok = 1 ] && break
  sleep 0.1
done
[ $ok = 1 ] || { echo "redis cluster: cluster_state never became ok"; exit 1; }
hosts=$(printf '127.0.0.1:%s,' "${ports[@]}"); hosts=${hosts%,}
echo "redis cluster $(redis-server --version | awk '{print $3}') on $hosts (3 masters)"
if [ "${BATON_CLUSTER_SHELL:-}" = 1 ]; then
  # For a person: keep the cluster up and print its URL.
  echo "redis+cluster://$hosts"; wait
fi
# Every conformance test runs here, the test clock's too: the client reads
# the clock's offset and passes it with every script call (the scripts run
# on their own shards, away from the offset's key).
if [ $# -eq 0 ]; then set -- redis::; fi
BATON_REQUIRE_BACKENDS=1 BATON_TEST_REDIS="redis+cluster://$hosts" cargo test --workspace --test conformance -- "$@"
