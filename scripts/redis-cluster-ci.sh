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
# The tests that move the store's clock (baton-testkit's test clock) are
# left out here: the clock's offset is one key, on one shard, and a
# cluster's queue and lock scripts run on their own shards, where they
# cannot read it (they see the real time). They run on single-node Redis
# (and every other store) in the main suite. Named one by one, so a new
# test is never left out unseen.
clock_tests=(
  a_running_scheduler_follows_the_store_clock at_least_is_honoured
  at_most_lapses_a_dropped_lease catch_up_all_runs_every_missed_slot_once
  catch_up_all_with_overlap_forbid catch_up_latest_runs_one_missed_slot
  claim_order_priority_run_at_id claim_tokens_rise_across_hand_back_rescue_and_retry
  client_clock_skew_changes_nothing debounce_leaves_a_running_task_alone
  debounce_pushes_the_due_time_to_the_last_change finish_is_compare_and_set
  rescue_out_of_attempts_fails_with_reason scheduler_joining_a_catch_up_runs_its_last_slot
  throttle_accepts_once_after_the_period
)
skips=()
for t in "${clock_tests[@]}"; do skips+=(--skip "redis::$t"); done
echo "redis cluster: ${#clock_tests[@]} test-clock tests left out (they run on single-node Redis)"
if [ $# -eq 0 ]; then set -- redis::; fi
BATON_REQUIRE_BACKENDS=1 BATON_TEST_REDIS="redis+cluster://$hosts" cargo test -p baton --test conformance -- "$@" "${skips[@]}"
