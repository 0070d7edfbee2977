// `k3flow plan MODEL_DIR [--trunk DIR] (--mem-gb X | --preset NAME | --trunk-gb X --cache-gb Y)
//  [--strategy S] [--context N] [--ring N] [--max-seqs N] [--json]`: how one memory budget splits into
// pools (pipeline/graph/planner.hpp), from the config and the shard headers only, so it sizes the 1.56 TB
// model from its sparse replica. It is the plan `k3flow generate` makes with the same flags for a run of
// --context positions (prompt + --gen + 1): both come from plan_run (pipeline/run/streaming_run.hpp).
// --spec N plans a `generate --spec N` run: its rollback journal and verify logits (docs/speculative.md).
// --routing-trace TRACE (e.g. fixtures/expert_trace.bin, Kimi K3's routing): the plan's expert slots
// replayed on that routing under --expert-policy (pipeline/graph/cache_sim.hpp) -- the hit rate to
// expect, the expert and total bytes read per token (docs/routing.md).
// `k3flow plan MODEL_DIR --ranks N [--json]`: what each of N MPI ranks holds and exchanges under
// `mpirun -np N k3flow generate` (pipeline/ranks/split.hpp, docs/distributed.md §3); with a budget
// flag, also the streamed plan of one rank's slice (its experts only, the exchange's buffers: §6),
// for --max-seqs sequences of --context positions as `mpirun -np N k3flow serve` plans each rank.
#include <fmt/format.h>

#include <filesystem>
#include <memory>
#include <optional>
#include <string>

#include "io/config.hpp"
#include "io/error.hpp"
#include "io/packed_trunk.hpp"
#include "io/safetensors.hpp"
#include "pipeline/cli/commands.hpp"
#include "pipeline/graph/cache_sim.hpp"
#include "pipeline/graph/planner.hpp"
#include "pipeline/graph/streaming_source.hpp"
#include "pipeline/ranks/split.hpp"
#include "pipeline/run/speculative.hpp"
#include "pipeline/run/streaming_run.hpp"
#include "pipeline/support/human_bytes.hpp"
#include "pipeline/support/output_file.hpp"

namespace k3::pipeline {

namespace {

namespace fs = std::filesystem;

struct PlanArgs {
  std::string model_dir;
  StreamFlags flags;
  uint64_t context = 128;
  int ring = 2;
  int ranks = 0;
  std::string routing_trace;
  bool json = false;
};

// What the C reference engine reads a token on the real checkpoint under an 8 GB memory cap (its
// published figure, docs/routing.md): the yardstick a plan's total is printed against.
constexpr double kReferenceBytesPerTokenAt8GB = 133e9;

// The plan's expert pool (in-flight, lookahead and cache slots: one pool, whatever the current layer
// does not pin is cache) replayed on a routing trace, one position at a time as a decode.
std::string expected_expert_reads(const PlanArgs& a, const MemoryPlan& p, uint64_t read_bytes) {
  const uint64_t slots = p.inflight_slots + p.lookahead_slots + p.cache_slots;
  if (slots == 0) return "";
  const RoutingTrace t = read_routing_trace(a.routing_trace);
  const ExpertPolicy policy =
      a.flags.expert_policy.empty() ? kDefaultExpertPolicy : parse_expert_policy(a.flags.expert_policy);
  const std::vector<ReplayGroup> g = replay_groups(t, ReplayOrder::incremental);
  uint64_t requests = 0;
  for (const ReplayGroup& x : g) requests += x.experts.size();
  const uint64_t hits = replay_hits(t, g, policy, slots), lru = replay_hits(t, g, ExpertPolicy::lru, slots),
                 best = belady_hits(t, g, slots);
  const double per_token = double(requests - hits) * double(read_bytes) / double(t.positions());
  const double total = per_token + double(p.streamed_bytes);
  return fmt::format(
      "  on the routing of {} ({} positions, top-{}): {} expert slots hit {:.1f} % under {} (lru {:.1f} %, "
      "Belady {:.1f} %); per token {} of experts + {} of trunk = {} read ({:.1f} GB; the C reference "
      "reads {:.0f} GB a token under an 8 GB cap)\n",
      a.routing_trace, t.positions(), t.top_k, slots, 100.0 * double(hits) / double(requests),
      expert_policy_name(policy), 100.0 * double(lru) / double(requests),
      100.0 * double(best) / double(requests), human_bytes(per_token), human_bytes(double(p.streamed_bytes)),
      human_bytes(total), total / 1e9, kReferenceBytesPerTokenAt8GB / 1e9);
}

std::string split_json(const ranks::RankSplit& s) {
  std::string ranks;
  for (const ranks::RankShare& r : s.per_rank)
    ranks += fmt::format("{}{{\"rank\":{},\"experts_per_layer\":{},\"expert_bytes\":{}}}",
                         ranks.empty() ? "" : ",", r.rank, r.experts_per_layer, r.expert_bytes);
  return fmt::format(
      "{{\"ranks\":{},\"layers\":{},\"moe_layers\":{},\"head_bytes\":{},\"trunk_bytes\":{},"
      "\"expert_bytes\":{},\"gather_bytes_per_layer_position\":{},\"gathers_per_token\":{},\"per_rank\":[{}]}"
      "}",
      s.ranks, s.bound_layers, s.moe_layers, s.head_bytes, s.trunk_bytes, s.all_expert_bytes, s.gather_bytes,
      s.moe_layers, ranks);
}

// The plan of one rank's slice with the same flags `mpirun -np N k3flow generate` gets (plan_run with a
// RankSlice): rank 0's, which owns the most experts (e mod N == 0 first), so every rank fits in it.
RunPlan rank_plan(const PlanArgs& a, const io::ModelConfig& config, const io::ShardSet& shards,
                  const ranks::RankSplit& split) {
  if (!a.flags.trunk_dir.empty()) check_trunk_dir(a.flags.trunk_dir);
  std::optional<io::PackedTrunk> trunk;
  if (!a.flags.trunk_dir.empty()) trunk.emplace(io::PackedTrunk::open(a.flags.trunk_dir, config.n_layers));
  const std::unique_ptr<WeightSources> src =
      WeightSources::open(config, shards, trunk ? &*trunk : nullptr, config.n_layers);
  RankSlice slice{.ranks = a.ranks, .owned_per_layer = split.per_rank[0].experts_per_layer};
  return plan_run(a.flags, *src, a.context, a.ring, 0, slice);
}

int run_rank_split(const PlanArgs& a) {
  const fs::path dir(a.model_dir);
  check_model_dir(dir);
  const io::ModelConfig config = io::load_config(dir / "config.json");
  const io::ShardSet shards = io::ShardSet::open(dir);
  const ranks::RankSplit split = ranks::split_ranks(shards, config, a.ranks);
  std::optional<RunPlan> run;
  // With a budget (or --trunk): each rank streams within it (docs/distributed.md §6).
  if (a.flags.budget_given() || !a.flags.trunk_dir.empty()) run = rank_plan(a, config, shards, split);
  if (run)
    for (const std::string& note : run->notes) fmt::print(stderr, "{}\n", note);
  if (a.json) {
    if (run)
      fmt::print("{{\"split\":{},\"rank\":0,\"plan\":{}}}\n", split_json(split), plan_json(run->plan));
    else
      fmt::print("{}\n", split_json(split));
  } else {
    fmt::print("{}", ranks::format_split(split, config));
    if (run) {
      fmt::print("\nstreamed per rank: rank 0's plan (the most experts, {} a layer; every rank's budget):\n",
                 split.per_rank[0].experts_per_layer);
      fmt::print("{}", format_plan(run->plan));
    }
  }
  return 0;
}

// What holding --max-seqs sequences costs against one at the same budget: the pinned trunk layers
// and expert slots their state displaces, and the trunk bytes a step reads more because of it.
std::string displaced_by_sequences(const PlanArgs& a, const WeightSources& src, const MemoryPlan& many) {
  StreamFlags one_flags = a.flags;
  one_flags.max_seqs = 1;
  const MemoryPlan one = plan_run(one_flags, src, a.context, a.ring).plan;
  const uint64_t state = uint64_t(many.max_seqs - 1) * (many.seq_kda_bytes + many.seq_kv_bytes);
  const uint64_t slots_one = one.inflight_slots + one.lookahead_slots + one.cache_slots;
  const uint64_t slots_many = many.inflight_slots + many.lookahead_slots + many.cache_slots;
  return fmt::format(
      "  against 1 sequence: the other {} sequences' state ({}) leaves {} of {} pinned trunk layers "
      "({} pinned), expert slots {} -> {}; trunk read per step {} -> {}\n",
      many.max_seqs - 1, human_bytes(state), many.pinned.size(), one.pinned.size(),
      one.pinned.size() >= many.pinned.size()
          ? fmt::format("{} fewer", one.pinned.size() - many.pinned.size())
          : fmt::format("{} more", many.pinned.size() - one.pinned.size()),
      slots_one, slots_many, human_bytes(one.streamed_bytes), human_bytes(many.streamed_bytes));
}

int run_plan(const PlanArgs& a) {
  if (a.ranks > 0) return run_rank_split(a);
  if (!a.flags.budget_given() && a.flags.trunk_dir.empty())
    throw io::usage_error(
        "plan: give a budget: --mem-gb X, --preset NAME, or --trunk-gb X with --cache-gb Y (or --trunk DIR "
        "alone: the whole model resident)");
  const fs::path dir(a.model_dir);
  check_model_dir(dir);
  if (!a.flags.trunk_dir.empty()) check_trunk_dir(a.flags.trunk_dir);
  if (!a.routing_trace.empty()) {
    if (a.json) throw io::usage_error("plan: --routing-trace prints beside the text plan, not with --json");
    check_input_file(a.routing_trace, "--routing-trace");
  }
  io::ModelConfig config = io::load_config(dir / "config.json");
  io::ShardSet shards = io::ShardSet::open(dir);
  std::optional<io::PackedTrunk> trunk;
  if (!a.flags.trunk_dir.empty()) trunk.emplace(io::PackedTrunk::open(a.flags.trunk_dir, config.n_layers));
  // The slot sizes of the run itself: the packed trunk's layers, or each layer's read window in the
  // shards, and the routed experts' windows.
  const std::unique_ptr<WeightSources> src =
      WeightSources::open(config, shards, trunk ? &*trunk : nullptr, config.n_layers);
  const RunPlan run = plan_run(a.flags, *src, a.context, a.ring);
  for (const std::string& note : run.notes) fmt::print(stderr, "{}\n", note);
  if (a.json) {
    fmt::print("{}\n", plan_json(run.plan));
  } else {
    fmt::print("{}", format_plan(run.plan));
    if (a.flags.max_seqs > 1) fmt::print("{}", displaced_by_sequences(a, *src, run.plan));
  }
  if (!a.routing_trace.empty() && !a.json)
    fmt::print("{}", expected_expert_reads(a, run.plan, src->expert_window_bytes()));
  return 0;
}

}  // namespace

Action add_plan(CLI::App& sub) {
  auto a = std::make_shared<PlanArgs>();
  sub.add_option("MODEL_DIR", a->model_dir, "checkpoint directory (config.json + *.safetensors)")->required();
  add_plan_flags(sub, a->flags);
  sub.add_option(
         "--context", a->context,
         "positions (tokens) the MLA KV cache and scratch are sized for (generate: prompt + --gen + 1)")
      ->capture_default_str()
      ->check(CLI::Range(uint64_t{1}, uint64_t{kMaxPositions}));
  sub.add_option("--ring", a->ring, "trunk ring slots, each as large as the largest streamed layer")
      ->capture_default_str()
      ->check(CLI::Range(2, 64));
  sub.add_option(
         "--max-seqs", a->flags.max_seqs,
         "sequences decoded together (a batched server): the plan holds each one's carried state "
         "(KDA + conv, KV cache for --context) and activations for a pass of max(min(--context, 64), N) ids")
      ->capture_default_str()
      ->check(CLI::Range(1, 4096));
  sub.add_option("--spec", a->flags.spec,
                 "the plan of generate/chat --spec N: it also holds a verify pass's KDA rollback journal "
                 "and N more rows of logits (docs/speculative.md)")
      ->capture_default_str()
      ->check(CLI::Range(0, kMaxSpec));
  sub.add_option("--ranks", a->ranks,
                 "the split over N MPI ranks instead (mpirun -np N k3flow generate, chat or serve): bytes "
                 "each rank holds, messages and bytes exchanged per token; with a budget also a rank's plan "
                 "(for --max-seqs sequences: serve's)")
      ->check(CLI::Range(1, 65536));
  add_prompt_cache_flag(sub, a->flags);
  sub.add_option("--routing-trace", a->routing_trace,
                 "replay this routing trace (e.g. fixtures/expert_trace.bin) on the plan's expert slots: the "
                 "hit rate to expect and the bytes read per token (docs/routing.md)");
  sub.add_flag("--json", a->json, "print the plan as one JSON object");
  return [a] { return run_plan(*a); };
}

}  // namespace k3::pipeline
