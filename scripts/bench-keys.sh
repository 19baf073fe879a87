#!/usr/bin/env bash
# The per-key concurrency cap's cost (issue #25 item 6): queue throughput
# with keyed tasks, the cap on and off, on each store, the configurations
# interleaved in each round so they are measured side by side. Caps are
# chosen not to bind (10 keys x cap 10, 10,000 keys x cap 1 against 4
# workers x 24 slots), so what is measured is the claim's cost, not the
# cap doing its job.
#
#   cargo build --release -p baton-bench
#   JOBS=20000 REPS=3 scripts/bench-keys.sh     # ~10 minutes
#   scripts/bench-keys.sh summary               # medians of $OUT
set -u
cd "$(dirname "$0")/.."
B=${B:-target/release/baton-bench}
JOBS=${JOBS:-20000}
REPS=${REPS:-3}
OUT=${OUT:-target/bench/keys.jsonl}
if [ "${1:-}" = summary ]; then
  exec python3 - "$OUT" <<'PY'
import json, statistics, sys, collections
runs = collections.defaultdict(list)
for line in open(sys.argv[1]):
    d = json.loads(line)
    if d["result"]:
        runs[(d["store"], d["config"])].append(d["result"]["jobs_per_s"])
stores = sorted({s for s, _ in runs}, key=["sqlite", "postgres", "mysql", "redis"].index)
configs = ["no keys", "10 keys no cap", "10 keys cap 10", "10000 keys no cap", "10000 keys cap 1"]
print("| store | " + " | ".join(configs) + " | cap on / off, 10 keys | 10,000 keys |")
print("|---" * (len(configs) + 3) + "|")
for s in stores:
    med = {c: statistics.median(runs[(s, c)]) for c in configs if runs[(s, c)]}
    cell = lambda c: "%.0f (%.0f–%.0f)" % (med[c], min(runs[(s, c)]), max(runs[(s, c)])) if c in med else "–"
    ratio = lambda on, off: "%.0f %%" % (100 * med[on] / med[off]) if on in med and off in med else "–"
    print("| %s | %s | %s | %s |" % (s, " | ".join(cell(c) for c in configs),
          ratio("10 keys cap 10", "10 keys no cap"), ratio("10000 keys cap 1", "10000 keys no cap")))
PY
fi
mkdir -p "$(dirname "$OUT")"
: > "$OUT"
declare -A URL=([sqlite]="sqlite:///tmp/baton-bench-keys.db"
  [postgres]="${PG:-postgres://postgres@127.0.0.1:5432/test}"
  [mysql]="${MYSQL:-mysql://root@127.0.0.1:3306/test}"
  [redis]="${REDIS:-redis://127.0.0.1:6379}")
for rep in $(seq 1 "$REPS"); do
  for store in ${STORES:-sqlite postgres mysql redis}; do
    for cfg in "none" "10 " "10 10" "10000 " "10000 1"; do
      set -- $cfg
      args=()
      label="no keys"
      if [ "$1" != none ]; then
        args+=(--keys "$1"); label="$1 keys"
        if [ -n "${2:-}" ]; then args+=(--per-key-cap "$2"); label="$label cap $2"; else label="$label no cap"; fi
      fi
      rm -f /tmp/baton-bench-keys.db*
      line=$(timeout 600 "$B" queue-throughput --store "${URL[$store]}" --jobs "$JOBS" --pool 20 "${args[@]}" 2>/dev/null | grep '^{' | tail -1)
      echo "{\"rep\":$rep,\"store\":\"$store\",\"config\":\"$label\",\"result\":${line:-null}}" >> "$OUT"
      echo "$rep $store $label: $(printf '%s' "$line" | python3 -c 'import json,sys; t=sys.stdin.read(); print(json.loads(t)["jobs_per_s"] if t else "failed")')"
    done
  done
done
