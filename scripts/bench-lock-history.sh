#!/bin/bash
# Lock cycle with lock history off and on, alternated, 3 rounds per store
# (docs/BENCHMARKS.md "Lock history in one statement"). Build first:
#   CARGO_PROFILE_RELEASE_LTO=false CARGO_PROFILE_RELEASE_CODEGEN_UNITS=16 \
#     cargo build --release -p baton-bench
# Prints: store round off|on cycles/s release-p50-ms.
B="$(dirname "$0")/../target/release/baton-bench"
run() { # store-url
  $B lock --store "$1" --api raw --duration 2 --concurrency 4 --pool 4 2>/dev/null | python3 -c '
import json,sys
d=json.loads([l for l in sys.stdin.read().splitlines() if l.startswith("{")][-1])
print(d["ops_per_s"], d["release_latency"].get("p50_ms", d["release_latency"]))'
}
for store in sqlite postgres mysql redis; do
  for round in 1 2 3; do
    for h in off on; do
      case $store in
        sqlite) url="sqlite:///tmp/ops-lockbench-$round-$h.db?lock_history=$h"; rm -f /tmp/ops-lockbench-$round-$h.db*;;
        postgres) url="postgres://postgres@127.0.0.1:5432/test?lock_history=$h";;
        mysql) url="mysql://root@127.0.0.1:3306/test?lock_history=$h";;
        redis) url="redis://127.0.0.1:6379?lock_history=$h";;
      esac
      echo "$store $round $h $(run "$url")"
    done
  done
done
