// `k3flow bench` comparing the overlap strategies (the default, without --batch), in two files:
// cmd_bench.cpp checks the flags, sets the comparison up (the plan, the rows, the child it runs) and
// reports it; bench_strategies.cpp runs its rounds -- in every repeat the device probed, the resident
// run, then every row, each run a child `k3flow generate` held to the first run's ids and logits.
#pragma once
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "io/config.hpp"
#include "io/packed_trunk.hpp"
#include "io/safetensors.hpp"
#include "pipeline/bench/bench_child.hpp"
#include "pipeline/bench/bench_report.hpp"
#include "pipeline/graph/planner.hpp"

namespace k3::pipeline {

inline constexpr const char* kAllStrategiesList = "serial,trunk,overlap,lookahead,auto";

// The flags of `k3flow bench` (cmd_bench.cpp declares them).
struct BenchArgs {
  std::string model_dir, trunk_dir, trunk_b_dir, preset, strategies = kAllStrategiesList, ids, out_path,
                                                         trace_dir;
  bool json = false;
  std::optional<double> mem_gb;
  int gen = 8, repeat = 3, threads = 0;
  std::string expert_policy;   // --expert-policy: passed to every streamed run
  std::string routing_replay;  // --routing-replay TRACE: passed to every streamed run
  std::string ring = "2";      // --ring N[,M...]: trunk ring slots of the streamed runs (one row each)
  double probe_seconds = 1.5;
  std::string batch;        // --batch 1,2,4,8: batched decode instead of the strategies (bench_batch.hpp)
  int batch_child = 0;      // --batch-child B (hidden): this process is one of --batch's children
  std::string batch_trace;  // --batch-trace FILE (hidden): that child's Chrome trace (--batch --trace-dir)
  size_t join = 0, prefill_chunk = 0;  // --join N, --prefill-chunk C: a prompt joining (bench_batch.hpp)
  std::string prefill = "inline,separate";
};

// One row of the table: a strategy at a ring depth, from one trunk.
struct BenchRow {
  std::string strategy, label, trunk_dir;
  int ring = 2;
  std::string pair;  // the label without the trunk: what the A/B comparison calls the pair
};

// The checkpoint, its trunks and the plan the rows run within.
struct BenchSetup {
  std::vector<int32_t> ids;  // the prompt
  io::ShardSet shards;
  std::optional<io::PackedTrunk> trunk{}, trunk_b{};
  PlanBudget pb{};
  MemoryPlan plan{};  // the deepest ring's
  std::vector<BenchRow> rows{};
};

// The child every run is: `<exe> generate ...`, with the flags its --help lists.
struct BenchChild {
  std::filesystem::path exe;
  std::string help;                           // its `generate --help`
  std::vector<std::string> base;              // argv every run starts with
  std::vector<std::filesystem::path> caches;  // dropped from the page cache before every run
  bool use_preset = false;                    // --preset passed as such (else as --mem-gb)
  bool has(const char* flag) const;
};

// What the rounds measured, for the report.
struct BenchRounds {
  std::vector<std::vector<RunSample>> samples;  // per row, per repeat
  bool resident = false;                        // the resident runs measured the compute
  std::vector<double> cpu, cpu_wall;            // the resident runs' compute and wall s/token
  uint64_t model_bytes = 0, avail = 0;          // the checkpoint's shards; the memory available
  std::vector<double> probe_trunk, probe_experts;
  uint64_t probed = 0, probed_direct = 0;  // probe bytes, and of them read through O_DIRECT
  std::vector<std::string> notes;          // the runs' NOTE lines
};

// Runs every round, printing a line per run to `txt`; fills `sum`'s probe samples and the rounds'
// figures. Throws runtime Error naming the run when a child fails or differs from the first.
BenchRounds run_rounds(const BenchArgs&, const io::ModelConfig&, const BenchSetup&, const BenchChild&,
                       ScratchDir&, BenchSummary& sum, std::FILE* txt);

}  // namespace k3::pipeline
