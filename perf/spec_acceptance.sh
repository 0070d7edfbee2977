#!/bin/bash
# Prompt-lookup acceptance on real runs (docs/speculative.md, "Acceptance"): `generate --gen GEN`
# plain and with `--spec N` for each N in SPECS on one checkpoint, greedy, same prompt. Per run:
# s/token over the decode (the first step, the prompt's prefill, left out) and its ratio to plain,
# trunk passes per token, tokens per pass, rows fed per token after the prompt's pass (plain: 1; on
# a resident, compute-bound model a pass costs about its rows), drafted / accepted / acceptance,
# the policy's pauses; and for the plain run where its ids become periodic (first position and
# period; "none" when they do not within GEN). Fails (exit 3) if a --spec run's ids differ from the
# plain run's. Every run is a child with its own page cache as the OS leaves it: for disk-bound
# timings use perf/spec_bench.sh / perf/spec_verify_bench.sh.
#
#   perf/spec_acceptance.sh K3FLOW_BINARY MODEL_DIR [more generate flags, e.g. --mem-gb 1.8 --trunk DIR]
#
# MODE=prompt (default): the prompt is IDS.
# MODE=repeat: "the model continuing text that repeats its own earlier output". A plain run first
#   generates O (GEN ids) from P = IDS; the runs then decode from P + O + P: the model has seen P
#   followed by O, so lookup proposes O, and the drafts are accepted as far as the model repeats
#   itself. Random-weight models need not (their next id depends on the whole context).
# FIXED=1 adds, for each N, a run with the drafter before the adaptive policy (--spec-policy fixed
#   --spec-min-match 1: N drafts at every match of one id or more).
# Environment: GEN (256), SPECS ("2 4 8"), IDS (P, default 1,2,3,4,5,6,7,8), MODE, FIXED (0),
# ROUNDS (1: runs alternate plain and each N ROUNDS times; the table gives the median s/token),
# THREADS (2), OUT (a new directory under /tmp).
set -euo pipefail

usage() { echo "usage: perf/spec_acceptance.sh K3FLOW_BINARY MODEL_DIR [generate flags...]" >&2; exit 2; }
[ $# -ge 2 ] || usage
K3FLOW=$(realpath "$1")
MODEL=$(realpath "$2")
shift 2
GEN=${GEN:-256}
SPECS=${SPECS:-"2 4 8"}
IDS=${IDS:-1,2,3,4,5,6,7,8}
MODE=${MODE:-prompt}
FIXED=${FIXED:-0}
ROUNDS=${ROUNDS:-1}
THREADS=${THREADS:-2}
OUT=${OUT:-$(mktemp -d /tmp/spec-acceptance.XXXXXX)}
[ -x "$K3FLOW" ] || { echo "spec_acceptance.sh: no k3flow binary at $K3FLOW" >&2; exit 2; }
[ -f "$MODEL/config.json" ] || { echo "spec_acceptance.sh: no checkpoint at $MODEL" >&2; exit 2; }
case "$MODE" in prompt | repeat) ;; *) echo "spec_acceptance.sh: MODE must be prompt or repeat" >&2; exit 2 ;; esac
mkdir -p "$OUT"

gen() {  # TAG [flags...]: one generate run on $PROMPT, its report in $OUT/TAG.json
  local tag=$1
  shift
  cut -d' ' -f1 /proc/loadavg > "$OUT/$tag.load"
  "$K3FLOW" generate "$MODEL" --ids "$PROMPT" --gen "$GEN" --ignore-eos --threads "$THREADS" --no-progress \
      --out "$OUT/$tag.json" "$@" > "$OUT/$tag.log" 2>&1 \
    || { echo "spec_acceptance.sh: k3flow failed, see $OUT/$tag.log" >&2; exit 1; }
}

PROMPT=$IDS
if [ "$MODE" = repeat ]; then
  gen source "$@"
  O=$(/usr/bin/python3 -c 'import json,sys; print(",".join(map(str, json.load(open(sys.argv[1]))["generated_ids"])))' \
        "$OUT/source.json")
  PROMPT="$IDS,$O,$IDS"
  echo "MODE=repeat: P = $IDS, O = the $GEN ids plain decoding continues P with; prompt P + O + P"
fi
echo "k3flow: $K3FLOW generate $MODEL --ids <$(echo "$PROMPT" | tr ',' '\n' | wc -l) ids> --gen $GEN" \
     "--threads $THREADS $*; --spec 0 vs $SPECS$([ "$FIXED" = 1 ] && echo ' (adaptive and fixed)')"
echo "$ROUNDS rounds; logs in $OUT"
for r in $(seq 1 "$ROUNDS"); do
  for n in 0 $SPECS; do
    if [ "$n" -eq 0 ]; then
      gen "spec0-$r" "$@"
      continue
    fi
    gen "spec$n-$r" --spec "$n" "$@"
    [ "$FIXED" = 1 ] && gen "fixed$n-$r" --spec "$n" --spec-policy fixed --spec-min-match 1 "$@"
  done
done

/usr/bin/python3 - "$OUT" "$ROUNDS" "$SPECS" "$FIXED" <<'PY'
import json, re, statistics, sys
out, rounds, specs, fixed = sys.argv[1], int(sys.argv[2]), [int(n) for n in sys.argv[3].split()], sys.argv[4] == "1"

def load(tag):
    d = json.load(open(f"{out}/{tag}.json"))
    log = open(f"{out}/{tag}.log").read()
    m = re.search(r"(\d+) tokens in ([\d.]+) s, .*?first step, with the \d+-id prompt: ([\d.]+) s", log)
    n, total, first = int(m[1]), float(m[2]), float(m[3])
    s = d.get("speculative")
    passes = s["passes"] if s else n
    drafted = s["drafted"] if s else 0
    return dict(ids=d["generated_ids"], s_tok=(total - first) / (n - 1) if n > 1 else float("nan"),
                load=float(open(f"{out}/{tag}.load").read()), passes=passes, drafted=drafted,
                accepted=s["accepted"] if s else 0, pauses=s["pauses"] if s else 0, n=n,
                rows=(passes - 1 + drafted) / (n - 1) if n > 1 else float("nan"))

def cycle(ids, most=64):  # (first position, period) from which ids repeat to the end, or None
    best = None
    for p in range(1, most + 1):
        i = len(ids) - p
        while i > 0 and ids[i - 1] == ids[i - 1 + p]:
            i -= 1
        if len(ids) - i >= 2 * p and (best is None or i < best[0]):
            best = (i, p)
    return best

kinds = [("plain", "spec0")] + [(f"{n}", f"spec{n}") for n in specs]
if fixed:
    kinds += [(f"{n} fixed", f"fixed{n}") for n in specs]
runs = {k: [load(f"{tag}-{r}") for r in range(1, rounds + 1)] for k, tag in kinds}
ref = runs["plain"][0]["ids"]
c = cycle(ref)
print(f"\nplain ids: {len(ref)}, " + (f"periodic from token {c[0]} with period {c[1]}" if c else "no cycle"))
try:
    src = json.load(open(f"{out}/source.json"))["generated_ids"]
    same = next((i for i, (a, b) in enumerate(zip(src, ref)) if a != b), min(len(src), len(ref)))
    print(f"repeat: the decode after P + O + P repeats O's first {same} ids")
except FileNotFoundError:
    pass
print(f"{'--spec':>8} {'load1':>6} {'s/token':>8} {'x plain':>7} {'passes':>6} {'passes/token':>12} "
      f"{'tokens/pass':>11} {'rows/token':>10} {'drafted':>7} {'accepted':>8} {'acceptance':>10} {'pauses':>6}  ids")
base = statistics.median(x["s_tok"] for x in runs["plain"])
bad = False
for k, _ in kinds:
    xs = runs[k]
    x = xs[0]
    st = statistics.median(y["s_tok"] for y in xs)
    same = all(y["ids"] == ref for y in xs)
    bad |= not same
    print(f"{k:>8} {statistics.median(y['load'] for y in xs):6.2f} {st:8.4f} {st / base:7.3f} {x['passes']:>6} "
          f"{x['passes'] / x['n']:12.3f} {x['n'] / x['passes']:11.2f} {x['rows']:10.3f} {x['drafted']:>7} "
          f"{x['accepted']:>8} {(x['accepted'] / x['drafted'] if x['drafted'] else 0):10.2f} {x['pauses']:>6}  "
          f"{'same' if same else 'DIFFERENT'}")
if bad:
    print("a --spec run's ids differ from plain's", file=sys.stderr)
    sys.exit(3)
PY
