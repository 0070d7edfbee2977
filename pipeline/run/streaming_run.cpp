#include "pipeline/run/streaming_run.hpp"

#include <fmt/format.h>
#include <malloc.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <optional>
#include <string>

#include "io/env.hpp"
#include "io/error.hpp"
#include "io/packed_trunk.hpp"
#include "pipeline/graph/graph_dot.hpp"
#include "pipeline/graph/planner.hpp"
#include "pipeline/graph/streaming_source.hpp"
#include "pipeline/graph/trace.hpp"
#include "pipeline/run/speculative.hpp"
#include "pipeline/support/human_bytes.hpp"
#include "pipeline/support/process_memory.hpp"

namespace k3::pipeline {

namespace {

constexpr uint64_t kGiB = uint64_t{1} << 30;
// This process's memory outside the planner's terms (the tensor index is one of them), as two
// allowances: code, libraries and the engine's tables (the routed-expert index is 16 B per expert),
// and the tokenizer a model directory ships (generate and chat load it), by its ranks. Measured when
// planning, after malloc_trim, on the tree of 2026-12-04: 9.9 MiB on a tiny synthetic without a
// tokenizer (10.2 MiB on the CI machine, whose libraries differ) and 10.3 MiB on the small synthetic;
// the full-size replica's 163,840-rank tokenizer adds about 74 B a rank. The allowance keeps ~2 MiB
// of headroom over the largest tokenizer-free figure: the binary's touched pages grow with it.
constexpr uint64_t kProcessAllowance = uint64_t{12} << 20;
constexpr uint64_t kTokenizerBytesPerRank = 96;
// Thread stacks actually touched, allocator arenas, per-call std::vector growth and the reader
// queues: not in the planner's terms, measured at a few MiB on the synthetic checkpoints.
constexpr uint64_t kSlackBytes = uint64_t{6} << 20;
// What each sequence holds outside the engine, per vocabulary entry: its logits row (4 B; a
// batch's caller keeps one per sequence beside the pass's) and its sampler's buffers -- the
// repeat-penalised copy (4 B), the candidates (8 B) and their probabilities (8 B). This replaced a
// measured 1 MiB per extra sequence (the peer checkpoint at its floor with 8 sequences went 2-6 MiB
// over): that excess was the pass's logits rows and activations the plan did not count, now
// planner terms, and these buffers (1.07 MiB a sequence at the peer's 46,592 ids).
constexpr uint64_t kSequenceBytesPerVocab = 4 + 4 + 8 + 8;

uint64_t gib_flag(double gb, const char* flag) {
  if (!(gb > 0) || !std::isfinite(gb) || gb > 1e6)
    throw io::usage_error(fmt::format("{} {} is not a positive size in GiB", flag, gb));
  return uint64_t(std::llround(gb * double(kGiB)));
}

}  // namespace

uint64_t available_memory_bytes() {
  if (const auto test = io::env::u64(io::env::kTestMemAvailable)) return *test;
  uint64_t avail = proc_field_kb("/proc/meminfo", "MemAvailable") * 1024;
  std::ifstream max_f("/sys/fs/cgroup/memory.max"), cur_f("/sys/fs/cgroup/memory.current");
  std::string max_s;
  uint64_t cur = 0;
  if (max_f >> max_s && max_s != "max" && cur_f >> cur) {
    const uint64_t lim = std::strtoull(max_s.c_str(), nullptr, 10);
    avail = std::min(avail, lim > cur ? lim - cur : 0);
  }
  return avail;
}

uint64_t checkpoint_bytes(const io::ShardSet& shards) {
  uint64_t n = 0;
  shards.for_each([&](std::string_view, const io::TensorInfo& t) { n += t.nbytes; });
  return n;
}

bool StreamFlags::requested() const {
  return !trunk_dir.empty() || !strategy.empty() || budget_given();
}

uint64_t prompt_cache_bytes(const StreamFlags& f) {
  return f.prompt_cache_gb == 0 ? 0 : gib_flag(f.prompt_cache_gb, "--prompt-cache-gb");
}

void add_prompt_cache_flag(CLI::App& sub, StreamFlags& f) {
  sub.add_option("--prompt-cache-gb", f.prompt_cache_gb,
                 "GiB of prompt-prefix state snapshots a server keeps, so a prompt that repeats an earlier "
                 "one's prefix prefills only the rest (0: off); part of the plan's budget")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1e6));
}

void check_stream_flags(const StreamFlags& f) {
  if (!f.strategy.empty() && !f.budget_given() && f.trunk_dir.empty())
    throw io::usage_error(
        fmt::format("--strategy needs a budget: --mem-gb X, --preset NAME or --trunk-gb X with --cache-gb Y "
                    "(or --trunk DIR to hold the whole model)"));
}

// A size in GiB: positive, finite, at most 1 PiB (CLI11's PositiveNumber printed its range as a
// 300-digit number).
CLI::Validator positive_gib() {
  return CLI::Validator(
      [](std::string& v) -> std::string {
        char* end = nullptr;
        const double x = std::strtod(v.c_str(), &end);
        if (end == v.c_str() || *end != '\0' || !(x > 0) || !std::isfinite(x) || x > 1048576.0)
          return fmt::format("{} is not a size in GiB (a number > 0, at most 1048576)", v);
        return {};
      },
      "GiB > 0");
}

// A --preset name, refused as the command line is read (before any config or checkpoint).
CLI::Validator known_preset() {
  return CLI::Validator(
      [](std::string& v) -> std::string {
        std::string known;
        for (const std::string& n : preset_names()) {
          if (n == v) return {};
          known += (known.empty() ? "" : ", ") + n;
        }
        return fmt::format("unknown preset '{}' (known: {})", v, known);
      },
      "NAME");
}

void add_plan_flags(CLI::App& sub, StreamFlags& f) {
  sub.add_option("--trunk", f.trunk_dir,
                 "packed trunk directory (trunk.json + trunk.bin): one read per layer. Without a budget "
                 "flag every layer is pinned and every expert cached, a budget of exactly what that needs "
                 "(refused when more than the memory available)");
  auto* mem =
      sub.add_option("--mem-gb", f.mem_gb,
                     "memory budget in GiB: weights are streamed to stay within it; never more is allocated "
                     "than the model needs")
          ->check(positive_gib());
  auto* preset =
      sub.add_option("--preset", f.preset,
                     "named budget: ultra (the floor), laptop 8, desktop 32, workstation 96, server "
                     "128, max 224 GiB")
          ->check(known_preset());
  auto* trunk_gb =
      sub.add_option("--trunk-gb", f.trunk_gb, "GiB for the trunk ring + pinned layers (with --cache-gb)")
          ->check(positive_gib());
  auto* cache_gb = sub.add_option("--cache-gb", f.cache_gb, "GiB for expert slots + cache (with --trunk-gb)")
                       ->check(positive_gib());
  trunk_gb->needs(cache_gb);
  cache_gb->needs(trunk_gb);
  mem->excludes(preset)->excludes(trunk_gb)->excludes(cache_gb);
  preset->excludes(trunk_gb)->excludes(cache_gb);
  sub.add_option(
         "--strategy", f.strategy,
         "overlap strategy: serial, trunk, overlap, lookahead, or auto (the default: lookahead's graph with "
         "the "
         "expert prefetch turned on or off by measuring this run's steps); all give the same bits. Needs a "
         "budget flag or --trunk")
      ->check(CLI::IsMember({"serial", "trunk", "overlap", "lookahead", "auto"}));
  sub.add_option("--expert-policy", f.expert_policy,
                 "expert cache replacement: run (the default: keeps the experts each layer kept using, "
                 "docs/routing.md) or lru; all give the same bits")
      ->check(CLI::IsMember({"lru", "run"}));
}

void add_stream_flags(CLI::App& sub, StreamFlags& f) {
  add_plan_flags(sub, f);
  if (!sub.get_option_no_throw("--context"))
    sub.add_option("--context", f.context,
                   "positions the MLA KV cache, the scratch and the plan are sized for (default: prompt + "
                   "--gen + 1; at least that)")
        ->check(CLI::Range(uint64_t{1}, uint64_t{kMaxPositions}));
  if (!sub.get_option_no_throw("--ring"))
    sub.add_option("--ring", f.ring, "trunk ring slots of a streamed run")
        ->capture_default_str()
        ->check(CLI::Range(2, 64));
  auto* on = sub.add_flag("--progress", f.progress,
                          "progress bars on stderr (loading, the first step) even when it is not a terminal");
  sub.add_flag("--no-progress", f.no_progress, "never draw progress bars")->excludes(on);
  sub.add_option("--trace", f.trace, "write a Chrome trace (Perfetto) of the streamed run");
  sub.add_option("--graph-dot", f.graph_dot, "write the flow graph as Graphviz DOT, annotated with the run");
}

RunPlan plan_run(const StreamFlags& f, const WeightSources& src, uint64_t context, int ring_slots,
                 uint64_t process_bytes, RankSlice slice) {
  RunPlan run;
  const uint64_t tokenizer = kTokenizerBytesPerRank * uint64_t(src.config().vocab);
  const uint64_t allowance = kProcessAllowance + tokenizer;
  const bool measured_more = process_bytes > allowance;
  const uint64_t process = measured_more ? process_bytes : allowance;
  PlanInputs bare = src.plan_inputs(context, spec_plan_terms(src.config(), src.n_layers(), f.spec),
                                    std::max(f.max_seqs, 1), f.spec);
  if (slice.ranks > 1) plan_rank_experts(bare, src.config(), slice.owned_per_layer, slice.ranks);
  PlanInputs in = bare;
  if (measured_more) {
    in.resident.push_back({"process and tokenizer (measured)", 1, process, process});
    run.notes.push_back(fmt::format(
        "NOTE: this process holds {} outside the planned terms, more than the {} allowance `k3flow plan` "
        "counts: planned with the measured figure",
        human_bytes(process_bytes), human_bytes(allowance)));
  } else {
    in.resident.push_back(
        {"process: code, libraries, tables (allowance)", 1, kProcessAllowance, kProcessAllowance});
    in.resident.push_back(
        {"tokenizer (allowance per rank)", uint64_t(src.config().vocab), kTokenizerBytesPerRank, tokenizer});
  }
  const uint64_t slack = kSlackBytes;
  in.resident.push_back({"threads, allocator and reader slack", 1, slack, slack});
  const uint64_t seqs = uint64_t(std::max(f.max_seqs, 1)),
                 per_seq = kSequenceBytesPerVocab * uint64_t(src.config().vocab);
  in.resident.push_back(
      {fmt::format("logits row + sampler buffers ({} sequence{})", seqs, seqs == 1 ? "" : "s"), seqs, per_seq,
       seqs * per_seq});
  if (const uint64_t cache = prompt_cache_bytes(f); cache > 0) {
    in.resident.push_back({"prompt cache: prefix snapshots (--prompt-cache-gb)", 1, cache, cache});
  }

  PlanBudget b;
  b.ring_slots = ring_slots;
  b.lookahead = f.strategy.empty() || parse_strategy(f.strategy) == Strategy::lookahead ||
                parse_strategy(f.strategy) == Strategy::automatic;
  if (!f.preset.empty()) {
    b.total = preset_budget(f.preset, in, b.ring_slots);
    b.source = fmt::format("--preset {}", f.preset);
  } else if (f.mem_gb > 0) {
    b.total = gib_flag(f.mem_gb, "--mem-gb");
    b.source = fmt::format("--mem-gb {}", f.mem_gb);
  } else if (f.trunk_gb > 0) {
    b.trunk = gib_flag(f.trunk_gb, "--trunk-gb");
    b.experts = gib_flag(f.cache_gb, "--cache-gb");
    b.source = fmt::format("--trunk-gb {} --cache-gb {}", f.trunk_gb, f.cache_gb);
  } else if (!f.trunk_dir.empty()) {
    // --trunk alone: the plan that holds the whole model, with a budget of exactly its total.
    PlanBudget all = b;
    all.total = uint64_t{1} << 62;
    b.total = make_plan(in, all).total();
    b.source = "--trunk without a budget: the whole model resident";
    const uint64_t avail = available_memory_bytes();
    if (avail && b.total > avail)
      throw io::usage_error(fmt::format(
          "--trunk without a budget holds the whole model, {} B, more than the memory available ({} B): give "
          "--mem-gb X, --preset NAME or --trunk-gb X with --cache-gb Y",
          b.total, avail));
  } else {
    check_stream_flags(f);
    const uint64_t avail = available_memory_bytes();
    if (avail == 0)
      throw io::usage_error("no budget given and /proc/meminfo has no MemAvailable: pass --mem-gb X");
    b.total = uint64_t(double(avail) * kDefaultBudgetShare);
    b.source = fmt::format("no budget flag: {:.0f}% of the {} available", kDefaultBudgetShare * 100,
                           human_bytes(avail));
  }
  b.source += fmt::format(", context {}, trunk {}", context,
                          f.trunk_dir.empty() ? "read from the shards" : f.trunk_dir);
  // The floor is the planner's (so plan, bench and generate refuse the same budgets). A budget above
  // it but too small to also hold the process terms is planned at the floor without them: the run
  // works, its peak RSS exceeds the budget by the least it can, and the warning says by how much and
  // which --mem-gb would hold.
  if (!b.trunk && b.total < plan_floor(in, b.ring_slots) && b.total >= plan_floor(bare, b.ring_slots)) {
    const uint64_t need = plan_floor(in, b.ring_slots), at = plan_floor(bare, b.ring_slots);
    run.notes.push_back(fmt::format(
        "WARNING: budget {} is above the plan floor but below floor + this process's own {} (process, slack, "
        "sampling buffers): planned at the floor, {}; peak RSS will exceed the budget by about {} (--mem-gb "
        "{:.3f} holds)",
        human_bytes(b.total), human_bytes(process + slack + seqs * per_seq), human_bytes(at),
        human_bytes(need - b.total), std::ceil(double(need) / double(kGiB) * 1e3) / 1e3));
    in = bare;
    b.source += ", planned at its floor (the WARNING above)";
    const uint64_t asked = b.total;
    b.total = at;
    run.plan = make_plan(in, b);
    // The budget stays the one asked for: what the plan leaves unassigned is the room the process
    // terms the plan could not hold will take, and reports quote the user's budget.
    run.plan.budget = asked;
    return run;
  }
  run.plan = make_plan(in, b);
  return run;
}

struct StreamRun::State {
  std::optional<io::PackedTrunk> trunk;
  std::unique_ptr<WeightSources> src;
  MemoryPlan plan;
  Strategy strategy = Strategy::automatic;
  GraphDescription dot;
  std::unique_ptr<StreamingModel> model;
  StreamFlags flags;
  std::vector<RunReport::Token> tokens;
};

StreamRun::~StreamRun() = default;

std::unique_ptr<StreamRun> StreamRun::open(const StreamFlags& f, const io::ModelConfig& cfg,
                                           const io::ShardSet& shards, int n_layers, uint64_t context,
                                           int gen, stages::ExpertExchange* experts, int ranks) {
  const uint64_t avail = available_memory_bytes();
  if (!f.requested()) {
    // No flag: resident unless the weights plus headroom do not fit in what the machine has free.
    const uint64_t need = checkpoint_bytes(shards);
    if (avail == 0 || need + need / 8 + (uint64_t{256} << 20) <= avail) return nullptr;
    std::printf(
        "weights (%s) do not fit in the memory available (%s): streaming within %.0f%% of it "
        "(--mem-gb or --preset sets the budget)\n",
        human_bytes(need).c_str(), human_bytes(avail).c_str(), kDefaultBudgetShare * 100);
  }

  auto run = std::unique_ptr<StreamRun>(new StreamRun());
  run->s_ = std::make_unique<State>();
  State& s = *run->s_;
  s.flags = f;
  s.strategy = f.strategy.empty() ? Strategy::automatic : parse_strategy(f.strategy);
  if (!f.trunk_dir.empty()) s.trunk.emplace(io::PackedTrunk::open(f.trunk_dir, cfg.n_layers));
  s.src = WeightSources::open(cfg, shards, s.trunk ? &*s.trunk : nullptr, n_layers);

  // What this process holds besides the planned terms (the tensor index is one of them), once the
  // heap the index parse freed has gone back to the OS.
  ::malloc_trim(0);
  const uint64_t index = shards.index_bytes() + (s.trunk ? s.trunk->index_bytes() : 0);
  const uint64_t rss = current_rss_bytes();
  RankSlice slice;
  if (experts && ranks > 1) {
    slice.ranks = ranks;
    for (int e = 0; e < cfg.n_experts; ++e) slice.owned_per_layer += experts->owns(e) ? 1 : 0;
  }
  RunPlan rp = plan_run(f, *s.src, context, f.ring, rss > index ? rss - index : 0, slice);
  s.plan = std::move(rp.plan);
  for (const std::string& note : rp.notes) std::printf("%s\n", note.c_str());
  std::printf("%s", format_plan(s.plan).c_str());
  std::printf(
      "streaming: strategy %s, trunk %s, %d of %d layers pinned, ring %d x %s, %llu expert slots\n",
      strategy_name(s.strategy), s.trunk ? "packed (trunk.bin)" : "from the shards",
      int(s.plan.pinned.size()), s.plan.n_layers, s.plan.ring_slots,
      human_bytes(s.plan.slot_read_bytes).c_str(),
      static_cast<unsigned long long>(s.plan.inflight_slots) + s.plan.lookahead_slots + s.plan.cache_slots);
  if (slice.ranks > 1)
    std::printf(
        "expert parallel: this rank streams the trunk and its %d of %d routed experts a layer; an "
        "expert_exchange node after each MoE layer's experts (docs/distributed.md §6)\n",
        slice.owned_per_layer, cfg.n_experts);

  if (!f.trace.empty()) {
    Trace::clear();
    Trace::enable();
    Trace::name_thread("main (driver, tbb)");
  }
  s.model = std::make_unique<StreamingModel>(
      *s.src, s.plan, s.strategy, f.graph_dot.empty() ? nullptr : &s.dot, ranks > 1 ? experts : nullptr,
      f.expert_policy.empty() ? kDefaultExpertPolicy : parse_expert_policy(f.expert_policy), f.threads);
  s.model->expect_calls(gen);
  if (!f.routing_trace.empty()) s.model->record_routing(f.routing_trace);
  if (!f.routing_replay.empty()) {
    s.model->replay_routing(read_routing_trace(f.routing_replay));
    std::printf(
        "NOTE: routing replayed from %s (bench --routing-replay): every MoE layer's top-k is the trace's, "
        "so the ids and logits are not the model's\n",
        f.routing_replay.c_str());
  }
  return run;
}

void StreamRun::forward(stages::DecodeState& st, std::span<const int32_t> ids, std::span<float> logits,
                        stages::HeadAt head_at) {
  s_->model->forward(st, ids, logits, head_at);
}

void StreamRun::forward_batch(std::span<const stages::Segment> segs, std::span<const int32_t> ids,
                              std::span<float> logits) {
  s_->model->forward_batch(segs, ids, logits);
}

void StreamRun::record_step(int step, int32_t token) {
  const StepStats& x = s_->model->last_step();
  s_->tokens.push_back(RunReport::Token{step, token, x.wall_seconds, x.io_wait_seconds, x.compute_seconds,
                                        x.trunk_bytes, x.expert_bytes, x.io_busy_seconds});
}

std::string StreamRun::step_note() const {
  const StepStats& x = s_->model->last_step();
  return fmt::format("read {} trunk + {} experts, io wait {:.3f} s", human_bytes(x.trunk_bytes),
                     human_bytes(x.expert_bytes), x.io_wait_seconds);
}

const StepStats& StreamRun::last_step() const {
  return s_->model->last_step();
}

StreamTotals StreamRun::totals() const {
  return s_->model->totals();
}

uint64_t StreamRun::bytes_read() const {
  const StreamTotals t = s_->model->totals();
  return t.trunk_bytes_read + t.expert_bytes_read;
}

uint64_t StreamRun::pass_rows() const {
  return s_->plan.pass_rows;
}

void StreamRun::finish(RunReport& r, double decode_seconds) {
  State& s = *s_;
  const StreamTotals t = s.model->totals();
  // Reads the last call set going (expert lookahead) may still be in flight: the model's end waits
  // for them, so the trace holds the end of every read it holds the start of.
  s.model.reset();
  if (!s.flags.trace.empty()) {
    Trace::disable();
    Trace::write(s.flags.trace);
    std::printf("wrote %s (Chrome trace, %zu events)\n", s.flags.trace.c_str(), Trace::event_count());
  }
  if (!s.flags.graph_dot.empty()) {
    s.dot.write_dot(s.flags.graph_dot);
    std::printf("wrote %s (flow graph)\n", s.flags.graph_dot.c_str());
  }
  std::printf(
      "streamed: trunk %s + experts %s read (%s through io_uring, %s O_DIRECT, %s pread); experts "
      "%llu requests, %llu hits; lookahead %llu prefetched, %llu used\n",
      human_bytes(t.trunk_bytes_read).c_str(), human_bytes(t.expert_bytes_read).c_str(),
      human_bytes(t.uring_bytes).c_str(), human_bytes(t.direct_bytes).c_str(),
      human_bytes(t.pread_bytes).c_str(), (unsigned long long)t.expert_requests,
      (unsigned long long)t.expert_hits, (unsigned long long)t.lookahead_predicted,
      (unsigned long long)t.lookahead_used);
  if (!t.automatic.empty()) std::printf("%s\n", t.automatic.c_str());
  if (t.codec != "none")
    std::printf("trunk codec %s: %s stored read, %s decoded in %.3f s by the decode stage\n", t.codec.c_str(),
                human_bytes(t.trunk_bytes_read).c_str(), human_bytes(t.trunk_decoded_bytes).c_str(),
                t.decode_seconds);
  const double eff =
      decode_seconds > 0 ? std::max(t.io_busy_seconds, t.compute_busy_seconds) / decode_seconds : 0;
  std::printf("I/O busy %.3f s, compute busy %.3f s of %.3f s decoding: overlap efficiency %.2f\n",
              t.io_busy_seconds, t.compute_busy_seconds, decode_seconds, eff);

  r.strategy = strategy_name(s.strategy);
  if (!s.flags.routing_replay.empty()) r.routing_replay = s.flags.routing_replay;
  r.budget_bytes = s.plan.budget;
  r.trunk_bytes_read = t.trunk_bytes_read;
  r.expert_bytes_read = t.expert_bytes_read;
  r.expert_requests = t.expert_requests;
  r.expert_hits = t.expert_hits;
  r.lookahead_predicted = t.lookahead_predicted;
  r.lookahead_used = t.lookahead_used;
  r.uring_bytes = t.uring_bytes;
  r.pread_bytes = t.pread_bytes;
  r.io_busy_seconds = t.io_busy_seconds;
  r.compute_busy_seconds = t.compute_busy_seconds;
  r.overlap_efficiency = eff;
  r.codec = t.codec;
  r.trunk_decoded_bytes = t.trunk_decoded_bytes;
  r.decode_seconds = t.decode_seconds;
  r.tokens = s.tokens;
}

}  // namespace k3::pipeline
