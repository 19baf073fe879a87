#!/usr/bin/env bash
# CI's chaos step: one seeded `baton chaos` run per store (SQLite, PostgreSQL,
# Redis, MySQL/MariaDB, and a Redis Sentinel deployment), each against a
# private server it starts itself (so the nemesis may also crash and restart
# it, or fail the Sentinel master over), all five at once. Prints each
# run's table and exits non-zero if any run reports a violation or fails.
#
#   scripts/chaos-ci.sh                 # 60 s of faults per store (CI)
#   CHAOS_DURATION=10m scripts/chaos-ci.sh
#   BATON_BIN=target/debug/baton scripts/chaos-ci.sh   # this binary, no build
#   scripts/chaos-ci.sh --unsafe        # extra arguments go to every run:
#                                       # this one must fail (exit 1)
#
# The seeds and fault lists are fixed, so a failure is reproduced with the
# command line the script prints. Run directories (history.jsonl, logs) are
# kept under $CHAOS_OUT (default: a new directory under /tmp).
set -euo pipefail
cd "$(dirname "$0")/.."

duration=${CHAOS_DURATION:-60s}
out=${CHAOS_OUT:-$(mktemp -d /tmp/baton-chaos-ci.XXXXXX)}
mkdir -p "$out"
# A private PostgreSQL runs as the `postgres` user (initdb refuses root): it
# must be able to reach its directory under this one (mktemp makes it 0700).
chmod 755 "$out"
# BATON_BIN: a baton binary already built (CI passes the one its tests
# built, so nothing is built or relinked here); else build it.
if [ -n "${BATON_BIN:-}" ]; then
  bin=$BATON_BIN
else
  cargo build -q -p baton-cli --bin baton
  bin=$(pwd)/target/debug/baton
fi

# store seed faults
runs=(
  "sqlite 101 kill-9,pause,freeze"
  "postgres 102 kill-9,pause,cut,dark,latency,restart,skew,freeze"
  "redis 103 kill-9,pause,cut,dark,latency,restart,skew,freeze"
  "mysql 104 kill-9,pause,cut,dark,latency,restart,skew,freeze"
  "redis-sentinel 105 kill-9,pause,freeze,failover"
)

declare -A pids cmds
for r in "${runs[@]}"; do
  read -r store seed faults <<<"$r"
  rm -rf "${out:?}/$store"
  cmd=("$bin" chaos --private "$store" --duration "$duration" --seed "$seed" --faults "$faults" "$@")
  cmds[$store]="${cmd[*]}"
  BATON_LOG=warn "${cmd[@]}" --dir "$out/$store" >"$out/$store.txt" 2>&1 &
  pids[$store]=$!
done

failed=()
for r in "${runs[@]}"; do
  read -r store _ <<<"$r"
  rc=0
  wait "${pids[$store]}" || rc=$?
  printf '\n-- %s: %s (exit %d)\n' "$store" "${cmds[$store]}" "$rc"
  cat "$out/$store.txt"
  [ "$rc" -eq 0 ] || failed+=("$store")
done

if [ "${#failed[@]}" -gt 0 ]; then
  printf '\nchaos: FAILED on %s (run directories in %s)\n' "${failed[*]}" "$out"
  exit 1
fi
printf '\nchaos: no violations on any store (%s of faults each)\n' "$duration"
