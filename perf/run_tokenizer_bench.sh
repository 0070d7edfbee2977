#!/usr/bin/env bash
# k3flow's tokenizer against OpenAI's tiktoken (npm `tiktoken`, the WASM build of its Rust core) on
# one core: load time of o200k_base.tiktoken and encode MB/s on the fixture corpus, with the o200k
# and the Kimi pattern over the same ranks. The two run alternately (A/B, the order flipping every
# round); the script prints min and median per figure and the ratio of medians, and fails if the
# two disagree on a single id of the benchmark text.
#
#   perf/run_tokenizer_bench.sh [BUILD_DIR] [ROUNDS]      (defaults: build, 5)
# Env: K3_BENCH_CPU (the core to pin to, default 1), K3_BENCH_MB (MB encoded per sample, default 4).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
build=$(realpath -m "${1:-$root/build}")
rounds=${2:-5}
cpu=${K3_BENCH_CPU:-1}
mb=${K3_BENCH_MB:-4}
fixtures=$root/fixtures/tokenizer
work=$build/tokenizer-bench
npm_dir=$work/npm  # tiktoken is installed here, never into the repository
mkdir -p "$work"

if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  echo "installing Debian's nodejs and npm"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends nodejs npm
fi
if [ ! -f "$npm_dir/node_modules/tiktoken/package.json" ]; then
  npm install --prefix "$npm_dir" --no-audit --no-fund --loglevel=error tiktoken@1.0.22 >/dev/null
fi

cmake --build "$build" --target bench_tokenizer -j2 >/dev/null
bench=$build/perf/bench_tokenizer
pin=()
if command -v taskset >/dev/null; then pin=(taskset -c "$cpu"); fi

run_k3() {
  (cd "$root" && "${pin[@]}" "$bench" --ranks "$fixtures/o200k_base.tiktoken" --corpus-dir "$fixtures" --mb "$mb" "$@")
}
run_tiktoken() {
  "${pin[@]}" node "$root/perf/tokenizer_baseline.mjs" "$npm_dir/node_modules" "$fixtures/o200k_base.tiktoken" \
    "$fixtures/o200k_pat_str.txt" "$fixtures/kimi_pat_str.txt" "$work/text.txt" "$@"
}

# The benchmark text, and both implementations' ids of it: they must be identical.
run_k3 --reps 1 --write-text "$work/text.txt" --dump-ids "$work/k3flow" >/dev/null
run_tiktoken 1 "$mb" "$work/tiktoken" >/dev/null
for p in o200k kimi; do
  if ! cmp -s "$work/k3flow.$p.bin" "$work/tiktoken.$p.bin"; then
    echo "FAIL: k3flow and tiktoken ids differ on the benchmark text with the $p pattern" >&2
    exit 1
  fi
done
echo "ids identical: $(($(stat -c %s "$work/k3flow.o200k.bin") / 4)) (o200k pattern), $(($(stat -c %s "$work/k3flow.kimi.bin") / 4)) (Kimi pattern) on $(stat -c %s "$work/text.txt") bytes"

samples=$work/samples.txt
: >"$samples"
for ((r = 1; r <= rounds; ++r)); do
  if ((r % 2)); then
    run_k3 --reps 3 >>"$samples"
    run_tiktoken 3 "$mb" >>"$samples"
  else
    run_tiktoken 3 "$mb" >>"$samples"
    run_k3 --reps 3 >>"$samples"
  fi
done

python3 - "$samples" "$rounds" "$cpu" <<'EOF'
import statistics, sys
samples, rounds, cpu = sys.argv[1], sys.argv[2], sys.argv[3]
data = {}
for line in open(samples):
    impl, metric, value = line.split()
    data.setdefault(metric, {}).setdefault(impl, []).append(float(value))
print(f"{rounds} A/B rounds, 3 samples each, pinned to CPU {cpu}; CPU time is this process's (the host is shared)")
print(f"{'figure':<24} {'k3flow min':>11} {'median':>9} {'tiktoken min':>13} {'median':>9} {'ratio':>7}")
for metric in ("load_cpu_ms", "load_wall_ms", "encode_o200k_cpu_mbps", "encode_o200k_wall_mbps",
               "encode_kimi_cpu_mbps", "encode_kimi_wall_mbps"):
    k, t = data[metric]["k3flow"], data[metric]["tiktoken"]
    mk, mt = statistics.median(k), statistics.median(t)
    # For times the ratio is tiktoken / k3flow, for rates k3flow / tiktoken: > 1 means k3flow is ahead.
    ratio = mt / mk if metric.endswith("_ms") else mk / mt
    print(f"{metric:<24} {min(k):>11.2f} {mk:>9.2f} {min(t):>13.2f} {mt:>9.2f} {ratio:>6.1f}x")
print("(ratio of medians, > 1 when k3flow is ahead: tiktoken/k3flow for times, k3flow/tiktoken for rates)")
if "unicode_table_cpu_ms" in data:
    print(f"k3flow Unicode class table, once per process: median {statistics.median(data['unicode_table_cpu_ms']['k3flow']):.2f} ms CPU")
EOF
