#!/bin/bash
# Two k3flow binaries, one benchmark: runs `k3flow bench` of binary A and binary B alternately
# (A, B, B, A, A, B, ... so neither always goes first) for ROUNDS rounds on the same checkpoint,
# budget, strategies and prompt, each round one `bench --repeat 1` per binary (the bench drops the
# page cache before every run itself). Prints, per strategy, the median and min s/token of each
# binary over the rounds, the ratio B/A of the medians, the geometric mean of each round's B/A
# ("paired": drift between rounds cancels) and in how many rounds B was faster, and fails (exit 3)
# if the two binaries ever emit different ids: a speed figure for a different answer is worth
# nothing.
#
#   perf/ab_bench.sh BINARY_A BINARY_B MODEL_DIR [bench flags...]
#
# Example (the restructured graph against the binary before it; $WIDE holds the wide synthetic
# profile, docs/performance.md):
#   ROUNDS=3 perf/ab_bench.sh OLD/k3flow build/k3flow $WIDE/model \
#     --trunk $WIDE/trunk --mem-gb 0.92 --gen 12 --threads 2
# Environment: ROUNDS (3), STRATEGIES (serial,trunk,overlap,lookahead,auto), OUT (a directory for
# every run's JSON; default a temporary one, removed).
set -euo pipefail
[ $# -ge 3 ] || { echo "usage: perf/ab_bench.sh BINARY_A BINARY_B MODEL_DIR [bench flags...]" >&2; exit 2; }
A=$(realpath "$1"); B=$(realpath "$2"); shift 2
ROUNDS=${ROUNDS:-3}
STRATEGIES=${STRATEGIES:-serial,trunk,overlap,lookahead,auto}
keep=1
if [ -z "${OUT:-}" ]; then OUT=$(mktemp -d); keep=0; fi
mkdir -p "$OUT"
[ "$keep" = 1 ] || trap 'rm -rf "$OUT"' EXIT
for r in $(seq 1 "$ROUNDS"); do
  if [ $((r % 2)) = 1 ]; then order="A B"; else order="B A"; fi
  for who in $order; do
    bin=$A; [ "$who" = B ] && bin=$B
    echo "round $r: $who ($bin), load $(cut -d' ' -f1 /proc/loadavg)" >&2
    "$bin" bench "$@" --strategy "$STRATEGIES" --repeat 1 --out "$OUT/$who-r$r.json" >/dev/null
  done
done
python3 - "$OUT" "$ROUNDS" "$A" "$B" <<'PY'
import json, statistics, sys
out, rounds, a, b = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
runs = {w: [json.load(open(f"{out}/{w}-r{r}.json")) for r in range(1, rounds + 1)] for w in "AB"}
ids = {json.dumps(s["ids"]) for w in "AB" for run in runs[w] for s in run["strategies"]}
print(f"A = {a}\nB = {b}\n{rounds} rounds, alternating; s/token over the decode steps")
print(f"{'strategy':<10} {'A median':>9} {'A min':>8} {'B median':>9} {'B min':>8} {'B/A':>6} {'paired':>7} {'B faster':>9}")
for i, s in enumerate(runs["A"][0]["strategies"]):
    name = s["strategy"]
    col = {w: [next(x for x in run["strategies"] if x["strategy"] == name)["s_per_token"] for run in runs[w]]
           for w in "AB"}
    ma, mb = statistics.median(col["A"]), statistics.median(col["B"])
    # Paired: each round's B/A (the two runs of a round are minutes apart, so the device's drift
    # between rounds cancels); their geometric mean, and in how many rounds B was the faster.
    pairs = [vb / va for va, vb in zip(col["A"], col["B"])]
    paired = statistics.geometric_mean(pairs)
    faster = f"{sum(p < 1 for p in pairs)}/{len(pairs)}"
    print(f"{name:<10} {ma:9.4f} {min(col['A']):8.4f} {mb:9.4f} {min(col['B']):8.4f} {mb / ma:6.3f} {paired:7.3f} {faster:>9}")
if len(ids) != 1:
    print("ab_bench: the binaries emitted different ids", file=sys.stderr)
    sys.exit(3)
print("ids identical across every run of both binaries")
PY
