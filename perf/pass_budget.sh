#!/bin/bash
# Peak RSS against the budget at the plan floor for passes of every size (issue 15): `generate`
# with a long prompt (fed in passes of the plan's pass_rows) and `bench --batch-child B --join N`
# (B - 1 decoding sequences, then an N-id prompt joining inline, whole). Each run's budget is the
# floor `k3flow plan --json` computes for its own context and sequences; the peak is the child's
# (/usr/bin/time %M). Functional, not a timing: prints budget, peak and the difference per case.
#
#   perf/pass_budget.sh MODEL_DIR [TRUNK_DIR]
#
# Environment: K3FLOW (default build/k3flow), PROMPT (prompt ids, default 130), GEN (3), SEQS (space-
# separated batch sizes >= 2 -- one joiner beside B - 1 decoding sequences --, default "4 8"),
# THREADS (2). Exit status: 1 when any peak exceeds its budget, 2 on a usage error.
set -euo pipefail

K3FLOW=${K3FLOW:-build/k3flow}
MODEL=${1:?usage: perf/pass_budget.sh MODEL_DIR [TRUNK_DIR]}
TRUNK=${2:-}
PROMPT=${PROMPT:-130}
GEN=${GEN:-3}
SEQS=${SEQS:-4 8}
THREADS=${THREADS:-2}
[ -x "$K3FLOW" ] || { echo "pass_budget.sh: no k3flow binary at $K3FLOW (set K3FLOW)" >&2; exit 2; }
for B in $SEQS; do
  [ "$B" -ge 2 ] || { echo "pass_budget.sh: SEQS: $B: a join needs at least 2 sequences" >&2; exit 2; }
done
trunk_args=()
[ -n "$TRUNK" ] && trunk_args=(--trunk "$TRUNK")
ids=$(/usr/bin/python3 -c "print(','.join(str(3 + (i * 37) % 1997) for i in range($PROMPT)))")
over=0

# floor CONTEXT SEQS -> "GiB-to-9-decimals bytes" (rounded up, as --mem-gb parses it)
floor() {
  "$K3FLOW" plan "$MODEL" "${trunk_args[@]}" --mem-gb 4096 --context "$1" --max-seqs "$2" --json |
    /usr/bin/python3 -c '
import json, math, sys
p = json.load(sys.stdin)
gb = math.ceil(p["floor"] / 2**30 * 1e9) / 1e9
print("%.9f %d %d" % (gb, round(gb * 2**30), p["sequences"]["pass_rows"]))'
}

# report LABEL BUDGET_BYTES PEAK_KIB
report() {
  local peak=$(($3 * 1024))
  printf '%-50s budget %12d B  peak %12d B  %+8.2f MiB\n' "$1" "$2" "$peak" \
    "$(/usr/bin/python3 -c "print(($peak - $2) / 2**20)")"
  [ "$peak" -le "$2" ] || over=1
}

read -r gb bytes rows < <(floor $((PROMPT + GEN + 1)) 1)
kib=$( { /usr/bin/time -f '%M' "$K3FLOW" generate "$MODEL" "${trunk_args[@]}" --ids "$ids" --gen "$GEN" \
  --mem-gb "$gb" --threads "$THREADS" --no-progress >/dev/null; } 2>&1 | tail -1)
report "generate, $PROMPT-id prompt ($rows-row passes)" "$bytes" "$kib"

for B in $SEQS; do
  read -r gb bytes rows < <(floor $((PROMPT + GEN + 1)) "$B")
  kib=$( { /usr/bin/time -f '%M' "$K3FLOW" bench "$MODEL" "${trunk_args[@]}" --mem-gb "$gb" --threads "$THREADS" \
    --gen "$GEN" --ids 7,8,9 --strategy overlap --batch-child "$B" --join "$PROMPT" --prefill inline \
    --prefill-chunk 0 >/dev/null; } 2>&1 | tail -1)
  report "bench --batch-child $B --join $PROMPT ($rows-row passes)" "$bytes" "$kib"
done
exit $over
