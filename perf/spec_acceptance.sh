#!/bin/bash
# Prompt-lookup acceptance on real runs (docs/speculative.md, "Acceptance"): `generate --gen GEN`
# plain and with `--spec N` for each N in SPECS on one checkpoint, same prompt, greedy. Random-weight
# checkpoints (the fixtures, `k3flow synth`) do not copy their context, but their greedy decoding
# tends to fall into a cycle after some tokens; from then on lookup drafts are right. Per run:
# s/token over the decode (the first step, the prompt's prefill, left out), trunk passes per token,
# drafted / accepted / acceptance, tokens per pass; and for the plain run where its ids become
# periodic (first position and period; "none" when they do not within GEN). Fails (exit 3) if a
# --spec run's ids differ from the plain run's. Every run is a child with its own page cache as the
# OS leaves it: for disk-bound timings use perf/spec_bench.sh / perf/spec_verify_bench.sh.
#
#   perf/spec_acceptance.sh K3FLOW_BINARY MODEL_DIR [more generate flags, e.g. --mem-gb 1.8 --trunk DIR]
#
# Environment: GEN (256), SPECS ("2 4 8"), IDS (the prompt, default 1,2,3,4,5,6,7,8), ROUNDS (1: runs
# alternate plain and each N ROUNDS times; the table gives the median s/token), THREADS (2),
# OUT (a new directory under /tmp).
set -euo pipefail

usage() { echo "usage: perf/spec_acceptance.sh K3FLOW_BINARY MODEL_DIR [generate flags...]" >&2; exit 2; }
[ $# -ge 2 ] || usage
K3FLOW=$(realpath "$1")
MODEL=$(realpath "$2")
shift 2
GEN=${GEN:-256}
SPECS=${SPECS:-"2 4 8"}
IDS=${IDS:-1,2,3,4,5,6,7,8}
ROUNDS=${ROUNDS:-1}
THREADS=${THREADS:-2}
OUT=${OUT:-$(mktemp -d /tmp/spec-acceptance.XXXXXX)}
[ -x "$K3FLOW" ] || { echo "spec_acceptance.sh: no k3flow binary at $K3FLOW" >&2; exit 2; }
[ -f "$MODEL/config.json" ] || { echo "spec_acceptance.sh: no checkpoint at $MODEL" >&2; exit 2; }
mkdir -p "$OUT"

echo "k3flow: $K3FLOW generate $MODEL --ids $IDS --gen $GEN --threads $THREADS $*; --spec 0 vs $SPECS"
echo "$ROUNDS rounds; logs in $OUT"
for r in $(seq 1 "$ROUNDS"); do
  for n in 0 $SPECS; do
    tag=spec$n-$r
    spec=()
    [ "$n" -gt 0 ] && spec=(--spec "$n")
    cut -d' ' -f1 /proc/loadavg > "$OUT/$tag.load"
    "$K3FLOW" generate "$MODEL" --ids "$IDS" --gen "$GEN" --ignore-eos --threads "$THREADS" --no-progress \
        "${spec[@]}" --out "$OUT/$tag.json" "$@" > "$OUT/$tag.log" 2>&1 \
      || { echo "spec_acceptance.sh: k3flow failed, see $OUT/$tag.log" >&2; exit 1; }
  done
done

/usr/bin/python3 - "$OUT" "$ROUNDS" "0 $SPECS" <<'PY'
import json, re, statistics, sys
out, rounds, specs = sys.argv[1], int(sys.argv[2]), [int(n) for n in sys.argv[3].split()]

def load(tag):
    d = json.load(open(f"{out}/{tag}.json"))
    log = open(f"{out}/{tag}.log").read()
    m = re.search(r"(\d+) tokens in ([\d.]+) s, .*?first step, with the \d+-id prompt: ([\d.]+) s", log)
    n, total, first = int(m[1]), float(m[2]), float(m[3])
    s = d.get("speculative")
    return dict(ids=d["generated_ids"], s_tok=(total - first) / (n - 1) if n > 1 else float("nan"),
                load=float(open(f"{out}/{tag}.load").read()),
                passes=s["passes"] if s else n, drafted=s["drafted"] if s else 0,
                accepted=s["accepted"] if s else 0, n=n)

def cycle(ids, most=64):  # (first position, period) from which ids repeat to the end, or None
    best = None
    for p in range(1, most + 1):
        i = len(ids) - p
        while i > 0 and ids[i - 1] == ids[i - 1 + p]:
            i -= 1
        if len(ids) - i >= 2 * p and (best is None or i < best[0]):
            best = (i, p)
    return best

runs = {n: [load(f"spec{n}-{r}") for r in range(1, rounds + 1)] for n in specs}
ref = runs[0][0]["ids"]
c = cycle(ref)
print(f"\nplain ids: {len(ref)}, " + (f"periodic from token {c[0]} with period {c[1]}" if c else "no cycle"))
print(f"{'--spec':>6} {'load1':>6} {'s/token':>8} {'x plain':>7} {'passes':>6} {'passes/token':>12} "
      f"{'tokens/pass':>11} {'drafted':>7} {'accepted':>8} {'acceptance':>10}  ids")
base = statistics.median(x["s_tok"] for x in runs[0])
bad = False
for n in specs:
    xs = runs[n]
    x = xs[0]
    st = statistics.median(y["s_tok"] for y in xs)
    same = all(y["ids"] == ref for y in xs)
    bad |= not same
    print(f"{n:>6} {statistics.median(y['load'] for y in xs):6.2f} {st:8.4f} {st / base:7.3f} {x['passes']:>6} "
          f"{x['passes'] / x['n']:12.3f} {x['n'] / x['passes']:11.2f} {x['drafted']:>7} {x['accepted']:>8} "
          f"{(x['accepted'] / x['drafted'] if x['drafted'] else 0):10.2f}  {'same' if same else 'DIFFERENT'}")
if bad:
    print("a --spec run's ids differ from plain's", file=sys.stderr)
    sys.exit(3)
PY
