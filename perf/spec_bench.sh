#!/bin/bash
# Speculative decoding (`generate --spec N`, docs/speculative.md) against plain greedy decoding on the
# peer checkpoint, alternating for ROUNDS rounds on two prompts:
#   repeat: a 32-id passage said twice -- a trained model continues the repetition and lookup
#           drafts hit;
#   plain:  perf/peer_profile.sh's 16 prompt ids -- nothing to look up until the text repeats itself;
# and three modes: plain (--spec 0), spec (--spec N, prompt lookup) and, on the repeat prompt,
# oracle (--spec N --spec-oracle IDS, IDS = what this round's plain run generated: every draft
# accepted, the upper bound). The peer checkpoint is synthetic (`k3flow synth`, random weights): it
# does not copy its context, so on it lookup drafts rarely exist and `spec` measures the overhead;
# `oracle` measures what a pass of N + 1 rows costs against N + 1 passes of one.
# The page cache is dropped before every run: /proc/sys/vm/drop_caches when writable, else each model
# and trunk file's pages (posix_fadvise DONTNEED, what `k3flow bench` does). Per run, from the --out
# report: s/token and bytes read per token over the decode (the prefill pass, which emits the first
# token, left out), trunk passes per token and the acceptance from the log. Then per prompt the min
# and median of plain and spec and their ratio. Fails (exit 3) if spec's ids differ from plain's: a
# speed figure for a different answer is worth nothing.
# A measured example is in docs/speculative.md.
#
#   perf/spec_bench.sh K3FLOW_BINARY [WORK_DIR]   (default out/peer: model/ and trunk/ as perf/peer_profile.sh leaves them)
#
# Environment: ROUNDS (3), GEN (32), SPEC (4, the drafts per pass), MEM_GB (1.8), THREADS (2),
# OUT (WORK_DIR/spec-bench-<utc time>). Measure on a quiet host (1-minute load < 1.5).
set -euo pipefail

usage() { echo "usage: perf/spec_bench.sh K3FLOW_BINARY [WORK_DIR]" >&2; exit 2; }
[ $# -ge 1 ] || usage
K3FLOW=$(realpath "$1")
WORK=$(realpath "${2:-out/peer}")
ROUNDS=${ROUNDS:-3}
GEN=${GEN:-32}
SPEC=${SPEC:-4}
MEM_GB=${MEM_GB:-1.8}
THREADS=${THREADS:-2}
OUT=${OUT:-$WORK/spec-bench-$(date -u +%Y%m%dT%H%M%SZ)}
MODEL=$WORK/model
TRUNK=$WORK/trunk
[ -x "$K3FLOW" ] || { echo "spec_bench.sh: no k3flow binary at $K3FLOW" >&2; exit 2; }
[ -f "$MODEL/config.json" ] || { echo "spec_bench.sh: no checkpoint at $MODEL" >&2; exit 2; }
[ -f "$TRUNK/trunk.json" ] || { echo "spec_bench.sh: no packed trunk at $TRUNK" >&2; exit 2; }

PLAIN_IDS=1008,10484,318,15383,387,2029,11,581,7245,9909,13,4711,300,25,1999,42
PASSAGE=1008,10484,318,15383,387,2029,11,581,7245,9909,13,4711,300,25,1999,42,2113,6151,290,3312,11,1023,4412,8801,13,517,2240,903,17,6024,3381,42
REPEAT_IDS=$PASSAGE,$PASSAGE
mkdir -p "$OUT"

source "$(dirname "$0")/drop_cache.sh"  # drop_cache DIR...: prints "dropped" or "fadvise"

run() {  # $1 = tag, $2 = ids, $3 = --spec value, $4 = --spec-oracle ids (or empty)
  local tag=$1
  echo "$(drop_cache "$MODEL" "$TRUNK") $(cut -d' ' -f1 /proc/loadavg)" > "$OUT/$tag.pre"
  "$K3FLOW" generate "$MODEL" --trunk "$TRUNK" --mem-gb "$MEM_GB" --threads "$THREADS" --ids "$2" \
      --gen "$GEN" --spec "$3" ${4:+--spec-oracle "$4"} --no-progress --out "$OUT/$tag.json" > "$OUT/$tag.log" 2>&1 \
    || { echo "spec_bench.sh: k3flow failed, see $OUT/$tag.log" >&2; exit 1; }
  echo "$tag: $(grep -m1 'tokens in' "$OUT/$tag.log")"
}

echo "k3flow: $K3FLOW generate $MODEL --trunk $TRUNK --mem-gb $MEM_GB --threads $THREADS --gen $GEN, --spec 0 vs $SPEC"
echo "$ROUNDS rounds; logs in $OUT"
for r in $(seq 1 "$ROUNDS"); do
  for prompt in repeat plain; do
    ids=$PLAIN_IDS
    [ "$prompt" = repeat ] && ids=$REPEAT_IDS
    run "$prompt-plain-$r" "$ids" 0 ""
    run "$prompt-spec-$r" "$ids" "$SPEC" ""
    if [ "$prompt" = repeat ]; then
      answer=$(grep -m1 '^generated ids:' "$OUT/$prompt-plain-$r.log" | sed 's/^generated ids: *//; s/ /,/g')
      run "$prompt-oracle-$r" "$ids" "$SPEC" "$answer"
    fi
  done
done

/usr/bin/python3 - "$OUT" "$ROUNDS" <<'PY'
import json, re, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])

def load(tag):
    d = json.load(open(f"{out}/{tag}.json"))
    log = open(f"{out}/{tag}.log").read()
    cache, load1 = open(f"{out}/{tag}.pre").read().split()
    # Report rows are per pass; the first pass is the prefill and emits exactly one token.
    rows = d["tokens"][1:]
    n = len(d["generated_ids"]) - 1
    spec = re.search(r"speculative: (\d+) drafted, (\d+) accepted .*?: ([\d.]+) trunk passes per token", log)
    return dict(ids=d["generated_ids"], load=float(load1), cache=cache,
                s_tok=sum(t["wall_seconds"] for t in rows) / n if n else float("nan"),
                mb_tok=sum(t["trunk_bytes"] + t["expert_bytes"] for t in rows) / n / 2**20 if n else float("nan"),
                passes_tok=len(rows) / n if n else float("nan"),
                acc=f"{spec[2]}/{spec[1]}" if spec else "-")

bad = False
print(f"\n{'run':<16} {'load1':>6} {'cache':>8} {'s/token':>8} {'MiB/token':>10} {'passes/token':>13} {'accepted':>9}  ids")
for prompt in ("repeat", "plain"):
    res = {}
    for mode in ("plain", "spec", "oracle"):
        if prompt == "plain" and mode == "oracle":
            continue
        res[mode] = [load(f"{prompt}-{mode}-{r}") for r in range(1, rounds + 1)]
    ref = res["plain"][0]["ids"]
    for r in range(rounds):
        for mode in res:
            x = res[mode][r]
            same = "same" if x["ids"] == ref else "DIFFERENT"
            bad |= x["ids"] != ref
            print(f"{prompt + '-' + mode + '-' + str(r + 1):<16} {x['load']:6.2f} {x['cache']:>8} {x['s_tok']:8.3f} "
                  f"{x['mb_tok']:10.1f} {x['passes_tok']:13.3f} {x['acc']:>9}  {same}")
    med = {m: statistics.median(x["s_tok"] for x in res[m]) for m in res}
    mn = {m: min(x["s_tok"] for x in res[m]) for m in res}
    mb = {m: statistics.median(x["mb_tok"] for x in res[m]) for m in res}
    for mode in res:
        if mode != "plain":
            print(f"  {prompt}: s/token plain {mn['plain']:.3f} min / {med['plain']:.3f} median, {mode} "
                  f"{mn[mode]:.3f} / {med[mode]:.3f}: {mode}/plain {med[mode] / med['plain']:.3f} (medians); "
                  f"MiB/token {mb['plain']:.1f} -> {mb[mode]:.1f}")
    print()
if bad:
    print("spec's ids DIFFER from plain's: the timing compares two different answers", file=sys.stderr)
    sys.exit(3)
PY
