#!/bin/sh
# A prompt joining a running batch, each prefill policy measured: `k3flow bench MODEL --batch B
# --join N` (pipeline/bench/bench_batch.hpp) runs B - 1 sequences decoding, then one with an N-id
# prompt joins; for each --prefill mode (inline: in the decode step; separate: a step of its own) it
# reports the joiner's time to first token, the running sequences' longest gap between two tokens
# (their stall) and aggregate tokens/s, with the page cache dropped before every child. Once with
# the whole prompt in one step, then once per chunk size in CHUNKS (--prefill-chunk). Default: the
# peer synthetic checkpoint, disk-bound at 1.81 GiB (docs/performance.md, "Batched decode").
#
#   perf/prefill_join.sh [BUILD_DIR] [OUT_DIR]        (defaults: build, out/prefill_join)
#   MODEL=out/peer/model TRUNK=out/peer/trunk MEM_GB=1.81 B=4 JOIN=64 CHUNKS="16" GEN=6 \
#     REPEAT=2 THREADS=2 perf/prefill_join.sh
set -eu
BUILD=${1:-build}
OUT=${2:-out/prefill_join}
MODEL=${MODEL:-out/peer/model}
TRUNK=${TRUNK-out/peer/trunk}
MEM_GB=${MEM_GB:-1.81}
B=${B:-4}
JOIN=${JOIN:-64}
CHUNKS=${CHUNKS-16}
GEN=${GEN:-6}
REPEAT=${REPEAT:-2}
THREADS=${THREADS:-2}
mkdir -p "$OUT"
stamp=$(date -u +%Y%m%dT%H%M%SZ)
set -- --mem-gb "$MEM_GB" --threads "$THREADS" --batch "$B" --join "$JOIN" --gen "$GEN" --repeat "$REPEAT"
[ -n "$TRUNK" ] && set -- --trunk "$TRUNK" "$@"
for chunk in 0 $CHUNKS; do
  log="$OUT/join-$stamp-chunk$chunk.txt"
  echo "== $(date -u +%H:%M:%S) UTC, load $(cut -d' ' -f1-3 /proc/loadavg): bench $MODEL $* --prefill-chunk $chunk" | tee "$log"
  "$BUILD/k3flow" bench "$MODEL" "$@" --prefill-chunk "$chunk" | tee -a "$log"
  echo "   load after: $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$log"
done
