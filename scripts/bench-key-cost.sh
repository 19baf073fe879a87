#!/usr/bin/env bash
# The cost of a cap and of a rate per key (issue #25 item 6): queue
# throughput with keyed tasks, off / cap / rate, with 10 and 10,000
# distinct keys, on each store, for one or two builds (OLD and NEW), every
# configuration interleaved in each round so they are measured side by
# side. Caps and rates are chosen not to bind against 4 workers x 24
# slots (10 keys: cap 10, 1000/100ms; 10,000 keys: cap 1, 10/1s). "Off"
# also buffers claimed tasks (the prefetch, up to 512 a worker), which a
# capped queue buffers only where its keys have places to spare: 10 keys x
# cap 10 is 100 places, so against "off" that cap does bind by Little's law
# (docs/BENCHMARKS.md session 27); "wide" is 10 keys capped at 1000, a cap
# that does not (session 29). With 10,000 keys "wide" is the same as "cap".
#
#   OLD=/tmp/bb-old NEW=target/release/baton-bench REPS=3 scripts/bench-key-cost.sh
#   OUT=... scripts/bench-key-cost.sh summary
set -u
cd "$(dirname "$0")/.."
JOBS=${JOBS:-10000}
REPS=${REPS:-3}
OUT=${OUT:-target/bench/key-cost.jsonl}
if [ "${1:-}" = summary ]; then
  exec python3 - "$OUT" <<'PY'
import json, statistics, sys, collections
runs = collections.defaultdict(list)
for line in open(sys.argv[1]):
    d = json.loads(line)
    if d["result"]:
        runs[(d["store"], d["side"], d["keys"], d["config"])].append(d["result"]["jobs_per_s"])
order = ["sqlite", "postgres", "mysql", "redis"]
stores = sorted({k[0] for k in runs}, key=order.index)
sides = sorted({k[1] for k in runs}, key=["old", "new"].index)
print("| store | build | keys | off | cap | wide cap | rate | cap ÷ off | wide ÷ off | rate ÷ off |")
print("|---|---|---|---|---|---|---|---|---|---|")
for s in stores:
    for keys in ["10", "10000"]:
        for side in sides:
            med = {c: statistics.median(runs[(s, side, keys, c)]) for c in ["off", "cap", "wide", "rate"] if runs[(s, side, keys, c)]}
            cell = lambda c: "{:,.0f}".format(med[c]) if c in med else "–"
            ratio = lambda c: "%.0f %%" % (100 * med[c] / med["off"]) if c in med and "off" in med else "–"
            print("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (s, side, "{:,}".format(int(keys)), cell("off"), cell("cap"), cell("wide"), cell("rate"), ratio("cap"), ratio("wide"), ratio("rate")))
PY
fi
mkdir -p "$(dirname "$OUT")"
: > "$OUT"
declare -A URL=([sqlite]="sqlite:///tmp/baton-bench-keycost.db"
  [postgres]="${PG:-postgres://postgres@127.0.0.1:5432/test}"
  [mysql]="${MYSQL:-mysql://root@127.0.0.1:3306/test}"
  [redis]="${REDIS:-redis://127.0.0.1:6379}")
declare -A BIN=()
[ -n "${OLD:-}" ] && BIN[old]=$OLD
BIN[new]=${NEW:-target/release/baton-bench}
SIDES=${SIDES:-$([ -n "${OLD:-}" ] && echo "old new" || echo new)}
for rep in $(seq 1 "$REPS"); do
  for store in ${STORES:-sqlite postgres mysql redis}; do
    for keys in 10 10000; do
      if [ "$keys" = 10 ]; then cap=10; rate=1000/100ms; else cap=1; rate=10/1s; fi
      cfgs="off cap rate"
      [ "$keys" = 10 ] && cfgs="off cap wide rate"
      for cfg in $cfgs; do
        for side in $SIDES; do
          args=(--keys "$keys")
          case $cfg in cap) args+=(--per-key-cap "$cap");; wide) args+=(--per-key-cap 1000);; rate) args+=(--per-key-rate "$rate");; esac
          rm -f /tmp/baton-bench-keycost.db*
          line=$(timeout 600 "${BIN[$side]}" queue-throughput --store "${URL[$store]}" --jobs "$JOBS" --pool 20 "${args[@]}" 2>/dev/null | grep '^{' | tail -1)
          echo "{\"rep\":$rep,\"store\":\"$store\",\"side\":\"$side\",\"keys\":\"$keys\",\"config\":\"$cfg\",\"result\":${line:-null}}" >> "$OUT"
          echo "$rep $store $keys $cfg $side: $(printf '%s' "$line" | python3 -c 'import json,sys; t=sys.stdin.read(); print(json.loads(t)["jobs_per_s"] if t else "failed")')"
        done
      done
    done
  done
done
