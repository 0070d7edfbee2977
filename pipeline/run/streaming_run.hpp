// `k3flow generate`'s streaming side: its flags, the decision resident vs streamed, the plan, the
// graph, and what the run report and the STEP table get from them. cmd_generate.cpp stays the
// decode loop; it calls forward() here instead of stages::forward when a StreamRun exists.
//
// Default strategy: auto -- lookahead's graph with its expert prefetch turned on or off by what this
// run's decode steps cost (prefetch_tuner.hpp): no fixed strategy was the fastest everywhere (the
// wide profile on a fast device had lookahead the slowest of four; see graph.hpp for the strategies).
//
// When the graph runs: any of --mem-gb / --preset / --trunk-gb + --cache-gb / --trunk, or (no flag)
// when the checkpoint does not fit in the available memory (then the budget is kDefaultBudgetShare
// of it; available_memory_bytes). Otherwise
// generate stays resident, exactly as before. A streaming flag without a budget flag:
//   --trunk alone: every layer pinned and every routed expert cached, with a budget of exactly what
//     that plan needs (the model plus state and allowances); refused (exit 2) when that exceeds
//     the available memory, naming the budget flags;
//   --strategy alone (or with --trace / --graph-dot): a usage error (exit 2) naming the budget flags.
// However large the budget, no pool is larger than the model can use (planner.hpp): the plan, and
// the allocation, never exceed the model plus state and allowances.
//
// The budget is what the OS will measure: besides the planner's own terms the plan counts this
// process's memory outside the pools (code, libraries, the engine's tables, the tokenizer: an
// allowance the process measures at start) and the threads' and allocator's slack, so the pools
// shrink by that much. The floor that refuses a budget (exit 2) is the planner's own, as
// `k3flow bench` computes it; a budget between that floor and floor + the process terms is planned
// at the floor with a warning that the peak RSS will exceed it (only tiny models get there: the
// process terms are 16 MiB + 96 B per vocabulary entry).
//
// `k3flow plan` prints the split `k3flow generate` runs: both call plan_run() with the same flags,
// the same slot sizes (WeightSources') and the same context (generate: prompt + --gen + 1 positions,
// which its plan header states; plan: --context). The process terms are fixed, not measured, so the
// split does not depend on which command computes it; generate measures the process and, should it
// hold more than the allowance, plans with the measured figure and says so.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "io/config.hpp"
#include "io/safetensors.hpp"
#include "pipeline/graph/graph.hpp"
#include "pipeline/graph/planner.hpp"
#include "pipeline/run/run_report.hpp"

// Declared, not included: CLI11 is a large header that only the files declaring flags need.
namespace CLI {
class App;
}  // namespace CLI

namespace k3::pipeline {

// Most positions (prompt + generation + 1, or a whole conversation) one sequence may hold, as the
// reference engines cap it: generate's --gen and chat's --context are bounded by it.
inline constexpr size_t kMaxPositions = 36864;

// The flags that decide a streamed run's plan.
struct StreamFlags {
  std::string trunk_dir, preset, strategy, trace, graph_dot;
  std::string expert_policy;                      // --expert-policy (empty: the default, run)
  std::string routing_trace;                      // generate --routing-trace F
  std::string routing_replay;                     // bench --routing-replay TRACE (its children)
  double mem_gb = 0, trunk_gb = 0, cache_gb = 0;  // 0: not given
  uint64_t context = 0;                           // --context (0: the run's own positions)
  int ring = 2;                                   // --ring: trunk ring slots
  int max_seqs = 1;                               // sequences whose state the plan holds (BatchEngine)
  int spec = 0;                                   // --spec N: plan its journal (run/speculative.hpp)
  double prompt_cache_gb = 0;                     // serve --prompt-cache-gb: a resident term of the plan
  int threads = 0;                                // the graph's arena: the command's ThreadLimit
  bool progress = false, no_progress = false;     // --progress / --no-progress
  bool requested() const;
  bool budget_given() const { return !preset.empty() || mem_gb > 0 || trunk_gb > 0; }
};

// Declares --trunk, --mem-gb, --preset, --trunk-gb, --cache-gb, --strategy, --expert-policy: what decides the
// plan
// (--max-seqs, the batched run's sequences, is declared by the commands that have it).
void add_plan_flags(CLI::App& sub, StreamFlags& flags);
// add_plan_flags; --context and --ring unless the command declared them already (plan and chat
// declare --context themselves, with the same meaning: the positions the KV cache, the scratch and
// the plan are sized for); --progress / --no-progress; --trace and --graph-dot.
void add_stream_flags(CLI::App& sub, StreamFlags& flags);

// Usage errors (exit 2) a command can raise before it reads anything: --strategy without a budget.
void check_stream_flags(const StreamFlags&);

// serve --prompt-cache-gb in bytes (0: no prompt cache), the very term plan_run() adds to the plan.
uint64_t prompt_cache_bytes(const StreamFlags&);
// Declares --prompt-cache-gb (serve, and plan to show serve's split).
void add_prompt_cache_flag(CLI::App& sub, StreamFlags& flags);

class WeightSources;

// The plan of a streamed run of `src` for `context` positions: `k3flow plan` prints it and
// `k3flow generate` runs it. Without a budget flag the budget is kDefaultBudgetShare of the available
// memory, or with --trunk what the everything-resident plan needs (see above). `process_bytes` is
// this process's memory outside the planned terms as measured (0: not measured); above the fixed
// allowance it replaces it. Throws usage Error (exit 2) for a budget below the planner's floor.
struct RunPlan {
  MemoryPlan plan;
  std::vector<std::string> notes;  // WARNING / NOTE lines to print with the plan
};
// One rank of several (expert parallel, docs/distributed.md §6): the plan is the rank's slice
// (plan_rank_experts). ranks == 1: the single process's plan.
struct RankSlice {
  int ranks = 1;
  int owned_per_layer = 0;  // routed experts of each MoE layer this rank owns
};
RunPlan plan_run(const StreamFlags&, const WeightSources& src, uint64_t context, int ring_slots = 2,
                 uint64_t process_bytes = 0, RankSlice slice = {});

class StreamRun {
 public:
  // Null when generate should stay resident. Prints the plan. Throws usage Error (exit 2) for a
  // budget below the plan floor, naming the shortfall. `experts` (one rank of `ranks`, expert
  // parallel): the rank streams the trunk and only the routed experts it owns, within its own
  // budget, and exchanges the rows after each MoE layer (StreamingModel's expert_exchange).
  static std::unique_ptr<StreamRun> open(const StreamFlags&, const io::ModelConfig&, const io::ShardSet&,
                                         int n_layers, uint64_t context, int gen,
                                         stages::ExpertExchange* experts = nullptr, int ranks = 1);
  ~StreamRun();

  void forward(stages::DecodeState&, std::span<const int32_t> ids, std::span<float> logits,
               stages::HeadAt head_at = stages::HeadAt::last);
  // One step over several sequences: StreamingModel::forward_batch.
  void forward_batch(std::span<const stages::Segment>, std::span<const int32_t> ids, std::span<float> logits);
  void record_step(int step, int32_t token);  // after forward(): the per-token row of the report
  std::string step_note() const;              // extra STEP-table text for the last step
  const StepStats& last_step() const;         // the last forward call's reads and times
  StreamTotals totals() const;                // the run's reads so far
  uint64_t bytes_read() const;                // trunk + expert bytes read so far in this run
  // Rows one forward call may carry (MemoryPlan::pass_rows): the callers (Decoder, BatchEngine)
  // split a longer feed into passes of at most this many; the activations are planned for it.
  uint64_t pass_rows() const;

  // After a successful run: ends the streamed model (forward() may not be called again), writes
  // --trace / --graph-dot, prints the I/O summary, fills the report.
  void finish(RunReport& report, double decode_seconds);

 private:
  StreamRun() = default;
  struct State;
  std::unique_ptr<State> s_;
};

// Bytes of every tensor in the shards (the resident footprint of the weights, to the byte).
uint64_t checkpoint_bytes(const io::ShardSet&);
// Memory this process could take now: MemAvailable from /proc/meminfo, capped by the headroom of a
// cgroup v2 memory.max; 0 when /proc/meminfo is unreadable. K3FLOW_TEST_MEM_AVAILABLE=BYTES replaces
// it (a test hook: a small machine).
uint64_t available_memory_bytes();
// Without a budget flag a model that does not fit is streamed within this share of the available
// memory, not all of it: the rest is for the page cache and the machine's other processes (a run
// planned at 100% on a shared 24 GiB machine was killed by the OOM killer).
inline constexpr double kDefaultBudgetShare = 0.8;

}  // namespace k3::pipeline
