#!/usr/bin/env bash
# Expert parallel's communication cost on this machine (docs/distributed.md §3): N = 1, 2, 4 ranks
# of build/perf/dist_bench over loopback on a synthetic K3-shaped checkpoint (bf16 trunk, MXFP4
# experts), each printing s/token split into exchange and compute, messages and bytes per token
# beside the design page's prediction. The ranks share this machine's cores: it measures what the
# exchange costs, not a speedup. Each rank runs cores / N threads. Measure on a quiet host (uptime load < 1.5).
# With MEM_GB, each N runs a second time streamed per rank within MEM_GB GiB (docs/distributed.md §6:
# the flow graph with its expert_exchange node).
#   perf/dist_bench.sh [BUILD_DIR=build] [SIZE=small] [GEN=16] [MEM_GB]
set -euo pipefail
build=${1:-build}
size=${2:-small}
gen=${3:-16}
mem_gb=${4:-}
model=$(mktemp -d -t k3_dist_bench.XXXXXX)
trap 'rm -rf "$model"' EXIT
"$build/k3flow" synth "$model/m" --size "$size" --seed 1 > /dev/null
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
echo "checkpoint: k3flow synth --size $size ($(du -sh "$model/m" | cut -f1)), prompt 16, $gen decoded tokens"
cores=$(nproc)
for n in 1 2 4; do
  threads=$(( cores / n > 0 ? cores / n : 1 ))  # the ranks share the cores: no rank oversubscribes them
  mpirun --oversubscribe -np "$n" "$build/perf/dist_bench" "$model/m" --prompt 16 --gen "$gen" --threads "$threads"
  if [ -n "$mem_gb" ]; then
    mpirun --oversubscribe -np "$n" "$build/perf/dist_bench" "$model/m" --prompt 16 --gen "$gen" --threads "$threads" \
      --mem-gb "$mem_gb"
  fi
done
