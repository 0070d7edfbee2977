#!/bin/bash
# What a verify pass costs (docs/speculative.md, "What a verify pass costs"): the wall time and the
# bytes read of one decode pass carrying exactly k drafts (k + 1 rows), for k = 0 (a plain one-token
# step), 1, 2, 4 and 8, on the disk-bound profile -- the peer checkpoint streamed at --mem-gb 1.8
# from its packed trunk. The target (issue 16): k = 4 costs at most 1.25x one token.
#
# Every pass carries exactly k drafts because the drafts come from --spec-oracle: the ids a plain
# reference run generated (so every draft is accepted and no rollback runs), and --gen is
# 1 + PASSES x (k + 1): the prompt's prefill emits one token, then PASSES verify passes emit k + 1
# each. k = 0 is plain decoding (no --spec, so its plan holds no journal: the plain run as it is)
# for 1 + PASSES tokens; its pass time is the forward call's. The per-pass figures come from the
# --out report: "speculative"."pass_log" (rows, drafted, accepted, the pass's wall time with sampling
# and rollback) joined with the streamed "tokens" rows (per pass: the forward call's wall time,
# trunk and expert bytes); the prefill pass is left out. Runs alternate k within each round (the
# order reversed every other round), the page cache of the model and the trunk is dropped before
# each (posix_fadvise DONTNEED, what `k3flow bench` does; /proc/sys/vm/drop_caches when writable),
# and per k the table gives min and median seconds per pass over ROUNDS x PASSES passes, MiB read per
# pass, and the ratio of the medians to k = 0. Fails (exit 3) if a run's ids differ from the
# reference's: a verify pass that changes the answer is no speed-up.
#
#   perf/spec_verify_bench.sh K3FLOW_BINARY [WORK_DIR]
#     WORK_DIR (default out/peer) holds model/ and trunk/ as perf/peer_profile.sh leaves them.
#
# Environment: ROUNDS (3), PASSES (3, verify passes per run), KS ("1 2 4 8"), MEM_GB (1.8),
# THREADS (2), TRUNK (WORK_DIR/trunk), OUT (WORK_DIR/spec-verify-<utc time>).
# Measure on a quiet host (1-minute load < 1.5); each run's load is printed next to it.
set -euo pipefail

usage() { echo "usage: perf/spec_verify_bench.sh K3FLOW_BINARY [WORK_DIR]" >&2; exit 2; }
[ $# -ge 1 ] || usage
K3FLOW=$(realpath "$1")
WORK=$(realpath "${2:-out/peer}")
ROUNDS=${ROUNDS:-3}
PASSES=${PASSES:-3}
KS=${KS:-"1 2 4 8"}
MEM_GB=${MEM_GB:-1.8}
THREADS=${THREADS:-2}
MODEL=$WORK/model
TRUNK=${TRUNK:-$WORK/trunk}
OUT=${OUT:-$WORK/spec-verify-$(date -u +%Y%m%dT%H%M%SZ)}
[ -x "$K3FLOW" ] || { echo "spec_verify_bench.sh: no k3flow binary at $K3FLOW" >&2; exit 2; }
[ -f "$MODEL/config.json" ] || { echo "spec_verify_bench.sh: no checkpoint at $MODEL" >&2; exit 2; }
[ -f "$TRUNK/trunk.json" ] || { echo "spec_verify_bench.sh: no packed trunk at $TRUNK" >&2; exit 2; }

IDS=1008,10484,318,15383,387,2029,11,581,7245,9909,13,4711,300,25,1999,42
KMAX=0
for k in $KS; do [ "$k" -gt "$KMAX" ] && KMAX=$k; done
mkdir -p "$OUT"

source "$(dirname "$0")/drop_cache.sh"  # drop_cache DIR...: prints "dropped" or "fadvise"

run() {  # $1 = tag, $2 = --gen, then extra flags
  local tag=$1 gen=$2
  shift 2
  echo "$(drop_cache "$MODEL" "$TRUNK") $(cut -d' ' -f1 /proc/loadavg)" > "$OUT/$tag.pre"
  "$K3FLOW" generate "$MODEL" --trunk "$TRUNK" --mem-gb "$MEM_GB" --threads "$THREADS" --ids "$IDS" \
      --gen "$gen" --no-progress --out "$OUT/$tag.json" "$@" > "$OUT/$tag.log" 2>&1 \
    || { echo "spec_verify_bench.sh: k3flow failed, see $OUT/$tag.log" >&2; exit 1; }
  echo "$tag (load $(cut -d' ' -f2 "$OUT/$tag.pre")): $(grep -m1 'tokens in' "$OUT/$tag.log")"
}

echo "k3flow: $K3FLOW generate $MODEL --trunk $TRUNK --mem-gb $MEM_GB --threads $THREADS"
echo "k = 0 $KS, $PASSES passes a run, $ROUNDS rounds; logs in $OUT"
# The reference: the ids the oracle drafts (enough for PASSES passes of KMAX + 1 tokens).
run reference $((1 + PASSES * (KMAX + 1)))
ANSWER=$(grep -m1 '^generated ids:' "$OUT/reference.log" | sed 's/^generated ids: *//; s/ /,/g')
for r in $(seq 1 "$ROUNDS"); do
  order="0 $KS"
  [ $((r % 2)) -eq 0 ] && order=$(echo "$order" | tr ' ' '\n' | tac | tr '\n' ' ')
  for k in $order; do
    if [ "$k" -eq 0 ]; then
      run "k0-$r" $((1 + PASSES))
    else
      run "k$k-$r" $((1 + PASSES * (k + 1))) --spec "$k" --spec-oracle "$ANSWER"
    fi
  done
done

/usr/bin/python3 - "$OUT" "$ROUNDS" "0 $KS" <<'PY'
import json, statistics, sys
out, rounds, ks = sys.argv[1], int(sys.argv[2]), [int(k) for k in sys.argv[3].split()]
ref = json.load(open(f"{out}/reference.json"))["generated_ids"]
bad = False
rows = {k: [] for k in ks}
print(f"\n{'run':<8} {'load1':>6} {'cache':>8} {'passes':>7} {'s/pass':>8} {'fwd s/pass':>11} {'MiB/pass':>9}  ids")
for r in range(1, rounds + 1):
    for k in ks:
        tag = f"k{k}-{r}"
        d = json.load(open(f"{out}/{tag}.json"))
        how, load1 = open(f"{out}/{tag}.pre").read().split()
        ids = d["generated_ids"]
        same = ids == ref[:len(ids)]
        bad |= not same
        toks = d["tokens"]
        # k = 0 is a plain run (no --spec: its plan holds no journal): one-token passes.
        log = d["speculative"]["pass_log"] if k else [
            dict(rows=1, drafted=0, accepted=0, seconds=t["wall_seconds"]) for t in toks]
        assert len(log) == len(toks), f"{tag}: {len(log)} passes logged, {len(toks)} report rows"
        # Leave the prefill out; every other pass must carry exactly k drafts, all accepted.
        sel = [(p, t) for p, t in list(zip(log, toks))[1:]]
        for p, t in sel:
            if p["drafted"] != k or p["accepted"] != k:
                print(f"{tag}: a pass drafted {p['drafted']} / accepted {p['accepted']}, not {k}", file=sys.stderr)
                bad = True
            rows[k].append(dict(s=p["seconds"], fwd=t["wall_seconds"],
                                mib=(t["trunk_bytes"] + t["expert_bytes"]) / 2**20, load=float(load1)))
        n = len(sel)
        print(f"{tag:<8} {float(load1):6.2f} {how:>8} {n:7d} "
              f"{sum(p['seconds'] for p, _ in sel) / n:8.3f} {sum(t['wall_seconds'] for _, t in sel) / n:11.3f} "
              f"{sum(t['trunk_bytes'] + t['expert_bytes'] for _, t in sel) / n / 2**20:9.1f}  "
              f"{'same' if same else 'DIFFERENT'}")
# s: the whole pass (forward + sampling + bookkeeping; k = 0: the forward call); fwd: the forward
# call alone. Ratios are of medians to k = 0's.
base = statistics.median(x["s"] for x in rows[0])
base_fwd = statistics.median(x["fwd"] for x in rows[0])
print(f"\n{'k':>2} {'rows':>4} {'passes':>6} {'s/pass min':>10} {'median':>8} {'x k=0':>6} "
      f"{'fwd min':>8} {'median':>8} {'x k=0':>6} {'MiB/pass':>9} {'x k=0':>6} {'s/token':>8}")
base_mib = statistics.median(x["mib"] for x in rows[0])
for k in ks:
    s = [x["s"] for x in rows[k]]
    f = [x["fwd"] for x in rows[k]]
    mib = statistics.median(x["mib"] for x in rows[k])
    med, fmed = statistics.median(s), statistics.median(f)
    print(f"{k:>2} {k + 1:>4} {len(s):>6} {min(s):10.3f} {med:8.3f} {med / base:6.3f} "
          f"{min(f):8.3f} {fmed:8.3f} {fmed / base_fwd:6.3f} {mib:9.1f} {mib / base_mib:6.3f} {med / (k + 1):8.3f}")
if 4 in rows:
    r4 = statistics.median(x["s"] for x in rows[4]) / base
    print(f"\ntarget: k = 4 costs <= 1.25x one token: {r4:.3f}x ({'met' if r4 <= 1.25 else 'NOT met'}); "
          f"loads {min(x['load'] for k in ks for x in rows[k]):.2f}..{max(x['load'] for k in ks for x in rows[k]):.2f}")
if bad:
    print("a run's ids or drafts differ from the reference: the timing is not of exact verify passes", file=sys.stderr)
    sys.exit(3)
PY
