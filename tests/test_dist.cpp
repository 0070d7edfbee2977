// Expert parallel (docs/distributed.md §2) in one process: N ranks as threads (ranks::ThreadGroup),
// each loading only its experts (ResidentModel::load with a RankExperts) and exchanging the expert
// slots it computed. Every rank's logits, step after step (prefill, then incremental decode and a
// batched pass), must be the single process's bytes, at N = 1..4, on the tiny oracle model and on
// a synthetic bf16 + MXFP4 checkpoint. The same with per-rank streaming (docs/distributed.md §6):
// every rank runs the streamed graph within its own plan (at its floor and in the middle, several
// strategies, from the shards and from a packed trunk), reading only its experts, with the
// expert_exchange node. Also: the status exchange that ends every rank's run when one cannot load,
// and the per-rank split and plan `plan --ranks` prints. The same under mpirun: test_dist_mpi.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "io/config.hpp"
#include "io/packed_trunk.hpp"
#include "io/safetensors.hpp"
#include "pipeline/graph/graph.hpp"
#include "pipeline/graph/planner.hpp"
#include "pipeline/graph/streaming_source.hpp"
#include "pipeline/ranks/comm.hpp"
#include "pipeline/ranks/rank_experts.hpp"
#include "pipeline/ranks/split.hpp"
#include "stages/bind.hpp"
#include "stages/forward.hpp"
#include "tests/fixture_json.hpp"
#include "tests/run_helpers.hpp"

using namespace k3;
namespace ranks = k3::pipeline::ranks;

namespace {

struct Model {
  io::ModelConfig cfg;
  io::ShardSet shards;
  Model(const std::string& dir)
      : cfg(io::load_config(dir + "/config.json")), shards(io::ShardSet::open(dir)) {}
};

// Prefill `prompt`, then `steps` greedy decode steps fed one id at a time, then one batched pass of
// two sequences: every logit of every call, concatenated. fwd(state, ids, logits) and
// batch(segments, ids, logits) run the model: resident (stages::forward) or streamed.
template <class Forward, class Batch>
std::vector<float> decode_with(const io::ModelConfig& c, int layers, const std::vector<int32_t>& prompt,
                               int steps, Forward&& fwd, Batch&& batch) {
  const size_t V = size_t(c.vocab);
  stages::DecodeState st(c, layers, prompt.size() + size_t(steps) + 2);
  std::vector<float> logits(V), all;
  fwd(st, std::span<const int32_t>(prompt), std::span<float>(logits));
  all.insert(all.end(), logits.begin(), logits.end());
  for (int s = 0; s < steps; ++s) {
    int32_t next = 0;
    for (size_t v = 1; v < V; ++v)
      if (logits[v] > logits[size_t(next)]) next = int32_t(v);
    fwd(st, std::span<const int32_t>(&next, 1), std::span<float>(logits));
    all.insert(all.end(), logits.begin(), logits.end());
  }
  // Two sequences in one pass: more rows per expert, experts chosen by both.
  stages::DecodeState a(c, layers, 8), b(c, layers, 8);
  const std::vector<int32_t> ids = {prompt[0], 5, 9, 3, prompt.back()};
  const stages::Segment segs[] = {{.state = &a, .first_row = 0, .rows = 3},
                                  {.state = &b, .first_row = 3, .rows = 2}};
  std::vector<float> two(2 * V);
  batch(std::span<const stages::Segment>(segs), std::span<const int32_t>(ids), std::span<float>(two));
  all.insert(all.end(), two.begin(), two.end());
  return all;
}

std::vector<float> decode(const stages::WeightSource& ws, const std::vector<int32_t>& prompt, int steps) {
  stages::Scratch scratch;
  return decode_with(
      ws.config(), ws.bound_layers(), prompt, steps,
      [&](stages::DecodeState& st, std::span<const int32_t> ids, std::span<float> logits) {
        stages::forward(ws, st, ids, stages::HeadAt::last, logits, scratch);
      },
      [&](std::span<const stages::Segment> segs, std::span<const int32_t> ids, std::span<float> logits) {
        stages::forward_batch(ws, segs, ids, logits, scratch);
      });
}

// The streamed graph on one rank (or alone: exchange null), within `plan`.
std::vector<float> decode_streamed(const pipeline::WeightSources& src, const pipeline::MemoryPlan& plan,
                                   pipeline::Strategy s, stages::ExpertExchange* exchange,
                                   const std::vector<int32_t>& prompt, int steps,
                                   pipeline::StreamTotals* totals = nullptr,
                                   pipeline::GraphDescription* dot = nullptr) {
  pipeline::StreamingModel m(src, plan, s, dot, exchange);
  std::vector<float> out = decode_with(
      src.config(), src.n_layers(), prompt, steps,
      [&](stages::DecodeState& st, std::span<const int32_t> ids, std::span<float> logits) {
        m.forward(st, ids, logits);
      },
      [&](std::span<const stages::Segment> segs, std::span<const int32_t> ids, std::span<float> logits) {
        m.forward_batch(segs, ids, logits);
      });
  if (totals) *totals = m.totals();
  return out;
}

// A budget between a plan's floor and everything: 0 = the floor, 1 = all it can use.
uint64_t budget_at(const pipeline::PlanInputs& in, double share) {
  const uint64_t floor = pipeline::plan_floor(in);
  pipeline::PlanBudget all;
  all.total = uint64_t{1} << 50;
  const uint64_t top = pipeline::make_plan(in, all).total();
  return floor + uint64_t(double(top - floor) * share);
}

pipeline::MemoryPlan plan_for(const pipeline::PlanInputs& in, double share, pipeline::Strategy s) {
  pipeline::PlanBudget b;
  b.total = budget_at(in, share);
  b.lookahead = s == pipeline::Strategy::lookahead || s == pipeline::Strategy::automatic;
  return pipeline::make_plan(in, b);
}

// Every rank of an N-thread group decodes with only its experts; returns each rank's logits.
std::vector<std::vector<float>> decode_on_ranks(const Model& m, int n, const std::vector<int32_t>& prompt,
                                                int steps, std::vector<uint64_t>* weight_bytes = nullptr) {
  ranks::ThreadGroup group(n);
  std::vector<std::vector<float>> out(static_cast<size_t>(n));
  if (weight_bytes) weight_bytes->assign(size_t(n), 0);
  group.run([&](ranks::Comm& comm) {
    ranks::RankExperts experts(comm);
    const auto model = stages::ResidentModel::load(m.shards, m.cfg, 0, &experts);
    if (weight_bytes) (*weight_bytes)[size_t(comm.rank())] = model->weight_bytes();
    out[size_t(comm.rank())] = decode(*model, prompt, steps);
  });
  return out;
}

bool same_bytes(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Per-rank streaming: every rank of an N-thread group streams the trunk and its own experts within
// its own plan (`share` of the way from its floor to everything) and exchanges through
// expert_exchange; returns each rank's logits, and each rank's expert bytes read and slots planned.
struct RankRun {
  std::vector<float> logits;
  uint64_t expert_bytes_read = 0, expert_slots = 0, routed_cap = 0;
  bool exchange_term = false;
};
std::vector<RankRun> stream_on_ranks(const Model& m, const io::PackedTrunk* trunk, int n, double share,
                                     pipeline::Strategy s, const std::vector<int32_t>& prompt, int steps) {
  ranks::ThreadGroup group(n);
  std::vector<RankRun> out(static_cast<size_t>(n));
  group.run([&](ranks::Comm& comm) {
    ranks::RankExperts experts(comm);
    const auto src = pipeline::WeightSources::open(m.cfg, m.shards, trunk, 0);
    pipeline::PlanInputs in = src->plan_inputs(64, {});
    int owned = 0;
    for (int e = 0; e < m.cfg.n_experts; ++e) owned += experts.owns(e) ? 1 : 0;
    if (n > 1) pipeline::plan_rank_experts(in, m.cfg, owned, n);
    const pipeline::MemoryPlan plan = plan_for(in, share, s);
    RankRun& r = out[size_t(comm.rank())];
    pipeline::StreamTotals totals;
    r.logits = decode_streamed(*src, plan, s, &experts, prompt, steps, &totals);
    r.expert_bytes_read = totals.expert_bytes_read;
    r.expert_slots = plan.inflight_slots + plan.lookahead_slots + plan.cache_slots;
    r.routed_cap = plan.routed_experts;
    for (const pipeline::PlanTerm& t : plan.pools)
      r.exchange_term |= t.name.find("expert exchange") != std::string::npos;
  });
  return out;
}

void check_exact(const std::string& dir, const std::vector<int32_t>& prompt, int steps) {
  const Model m(dir);
  const auto whole = stages::ResidentModel::load(m.shards, m.cfg);
  const std::vector<float> ref = decode(*whole, prompt, steps);
  for (int n = 1; n <= 4; ++n) {
    CAPTURE(n);
    std::vector<uint64_t> bytes;
    const auto per_rank = decode_on_ranks(m, n, prompt, steps, &bytes);
    for (int r = 0; r < n; ++r) {
      CAPTURE(r);
      CHECK(same_bytes(per_rank[size_t(r)], ref));
      // Each rank holds only its experts: fewer bytes than the whole model once N > 1.
      if (n > 1) CHECK(bytes[size_t(r)] < whole->weight_bytes());
    }
  }
}

// The single process's resident logits, then N = 1..4 ranks each streaming its slice: at its floor
// and in the middle under the default strategy (auto), at the floor under trunk (a rank that owns
// none of a layer's experts starts its shared experts itself) and in the middle under serial; and at
// everything under overlap (no prefetch guesses), where every expert is read once: the ranks' expert
// reads add up to the single process's, each rank reading only its own.
void check_streamed(const std::string& dir, const io::PackedTrunk* trunk, const std::vector<int32_t>& prompt,
                    int steps) {
  const Model m(dir);
  const auto whole = stages::ResidentModel::load(m.shards, m.cfg);
  const std::vector<float> ref = decode(*whole, prompt, steps);
  using pipeline::Strategy;
  const auto src = pipeline::WeightSources::open(m.cfg, m.shards, trunk, 0);
  const pipeline::PlanInputs in = src->plan_inputs(64, {});
  pipeline::StreamTotals alone;
  CHECK(same_bytes(decode_streamed(*src, plan_for(in, 1.0, Strategy::overlap), Strategy::overlap, nullptr,
                                   prompt, steps, &alone),
                   ref));
  REQUIRE(alone.expert_bytes_read > 0);
  const struct {
    double share;
    Strategy s;
  } runs[] = {{0.0, Strategy::automatic},
              {0.5, Strategy::automatic},
              {0.0, Strategy::trunk},
              {0.5, Strategy::serial},
              {1.0, Strategy::overlap}};
  for (int n = 1; n <= 4; ++n) {
    for (const auto& run : runs) {
      CAPTURE(n);
      CAPTURE(run.share);
      CAPTURE(pipeline::strategy_name(run.s));
      const std::vector<RankRun> ranks = stream_on_ranks(m, trunk, n, run.share, run.s, prompt, steps);
      uint64_t read = 0;
      for (int r = 0; r < n; ++r) {
        CAPTURE(r);
        const RankRun& x = ranks[size_t(r)];
        CHECK(same_bytes(x.logits, ref));
        // the rank's plan: its experts only, and the exchange's buffers
        const uint64_t moe_layers = uint64_t(m.cfg.n_layers - m.cfg.first_dense);
        CHECK(x.routed_cap == moe_layers * uint64_t((m.cfg.n_experts - r + n - 1) / n));
        CHECK(x.expert_slots <= x.routed_cap);
        CHECK(x.exchange_term == (n > 1));
        read += x.expert_bytes_read;
        if (n > 1 && run.share == 1.0) CHECK(x.expert_bytes_read < alone.expert_bytes_read);
      }
      if (run.share == 1.0) CHECK(read == alone.expert_bytes_read);  // each expert once, on its owner
    }
  }
}

}  // namespace

TEST_CASE(
    "expert parallel on the tiny oracle model: every rank's logits are the single process's bytes, N = "
    "1..4") {
  check_exact(test::fixture_path("tiny-k3"), {1, 17, 200, 3, 42, 99, 7}, 6);
}

TEST_CASE("expert parallel on a synthetic bf16 + MXFP4 checkpoint: byte-identical logits, N = 1..4") {
  test::TempDir dir;
  const std::string model = dir / "m";
  // 6 layers (dense 0, MoE 1..5), 32 MXFP4 experts top-4, bf16 trunk, 2 shards.
  const test::Run s =
      test::k3flow(fmt::format("synth {} --size tiny --layers 6 --shards 2 --seed 11", model));
  REQUIRE_MESSAGE(s.code == 0, s.err);
  const Model m(model);
  REQUIRE(m.cfg.n_experts > 4);
  check_exact(model, {3, 1, 4, 1, 5, 9, 2, 6}, 5);
}

TEST_CASE("a rank holds only the experts it owns, and asking it for another's is an error") {
  const Model m(test::fixture_path("tiny-k3"));
  ranks::ThreadGroup group(3);
  std::mutex mu;
  std::vector<std::string> errors;
  group.run([&](ranks::Comm& comm) {
    ranks::RankExperts experts(comm);
    const auto model = stages::ResidentModel::load(m.shards, m.cfg, 0, &experts);
    for (int e = 0; e < m.cfg.n_experts; ++e) {
      CHECK(experts.owns(e) == (e % 3 == comm.rank()));
      if (experts.owns(e)) continue;
      try {
        (void)model->expert(1, e);
      } catch (const io::Error& err) {
        std::lock_guard lock(mu);
        errors.push_back(err.what());
      }
    }
  });
  size_t not_owned = 0;
  for (int r = 0; r < 3; ++r)
    for (int e = 0; e < m.cfg.n_experts; ++e) not_owned += (e % 3 != r);
  REQUIRE(errors.size() == not_owned);
  CHECK(errors[0].find("held by another process") != std::string::npos);
}

TEST_CASE("one rank's load failure ends every rank's run with that rank's message") {
  ranks::ThreadGroup group(3);
  std::vector<std::string> seen(3);
  std::vector<int> collective(3, 0), kinds(3, -1);
  group.run([&](ranks::Comm& comm) {
    try {
      ranks::on_every_rank(comm, "could not load its slice", [&] {
        if (comm.rank() == 1)
          throw io::runtime_error("/models/x/model-00002-of-00003.safetensors: truncated");
      });
    } catch (const ranks::CollectiveError& e) {
      seen[size_t(comm.rank())] = e.what();
      collective[size_t(comm.rank())] = 1;
      kinds[size_t(comm.rank())] = int(e.kind());
    }
  });
  for (int r = 0; r < 3; ++r) {
    CAPTURE(r);
    CHECK(collective[size_t(r)] == 1);
    CHECK(kinds[size_t(r)] == int(io::ErrorKind::runtime));
    CHECK(seen[size_t(r)] ==
          "rank 1 of 3 could not load its slice: /models/x/model-00002-of-00003.safetensors: truncated");
  }
  // Nobody failed: nothing is thrown anywhere.
  group.run([](ranks::Comm& comm) { CHECK_NOTHROW(ranks::on_every_rank(comm, "loading", [] {})); });
}

TEST_CASE("the per-rank split: every expert on exactly one rank, bytes adding up to the whole") {
  const Model m(test::fixture_path("tiny-k3"));
  const auto whole = stages::ResidentModel::load(m.shards, m.cfg);
  for (int n : {1, 2, 3, 4}) {
    CAPTURE(n);
    const ranks::RankSplit s = ranks::split_ranks(m.shards, m.cfg, n);
    REQUIRE(s.per_rank.size() == size_t(n));
    int experts = 0;
    uint64_t expert_bytes = 0;
    for (const ranks::RankShare& r : s.per_rank) {
      experts += r.experts_per_layer;
      expert_bytes += r.expert_bytes;
    }
    CHECK(experts == m.cfg.n_experts);
    CHECK(expert_bytes == s.all_expert_bytes);
    CHECK(s.head_bytes + s.trunk_bytes + s.all_expert_bytes == whole->weight_bytes());
    CHECK(s.moe_layers == m.cfg.n_layers - m.cfg.first_dense);
    CHECK(s.gather_bytes == uint64_t(m.cfg.top_k) * uint64_t(m.cfg.latent) * 4);
  }
}

TEST_CASE("k3flow plan --ranks N prints each rank's share; with a budget also rank 0's streamed plan") {
  const std::string tiny = test::fixture_path("tiny-k3");
  const Model m(tiny);
  const ranks::RankSplit s = ranks::split_ranks(m.shards, m.cfg, 3);
  const test::Run json = test::k3flow(fmt::format("plan {} --ranks 3 --json", tiny));
  REQUIRE_MESSAGE(json.code == 0, json.err);
  CHECK(json.out.find("\"ranks\":3,") != std::string::npos);
  CHECK(json.out.find(fmt::format("\"trunk_bytes\":{},", s.trunk_bytes)) != std::string::npos);
  for (const ranks::RankShare& r : s.per_rank)
    CHECK(json.out.find(fmt::format("{{\"rank\":{},\"experts_per_layer\":{},\"expert_bytes\":{}}}", r.rank,
                                    r.experts_per_layer, r.expert_bytes)) != std::string::npos);
  const test::Run text = test::k3flow(fmt::format("plan {} --ranks 3", tiny));
  REQUIRE_MESSAGE(text.code == 0, text.err);
  CHECK(text.out.find("split over 3 ranks") != std::string::npos);
  CHECK(text.out.find(fmt::format("{} allgathers", s.moe_layers)) != std::string::npos);
  // With a budget: rank 0's plan (4 of tiny's 8 experts a layer at N = 2), the exchange's two buffers
  // in it (a pass of --context rows x top_k x latent floats each).
  const test::Run budget = test::k3flow(fmt::format("plan {} --ranks 2 --mem-gb 1 --context 16", tiny));
  REQUIRE_MESSAGE(budget.code == 0, budget.err);
  CHECK(budget.out.find("split over 2 ranks") != std::string::npos);
  CHECK(budget.out.find("rank 0's plan (the most experts, 4 a layer") != std::string::npos);
  const uint64_t each = 16 * uint64_t(m.cfg.top_k) * uint64_t(m.cfg.latent) * 4;
  CHECK(budget.out.find("expert exchange: send + receive (1 of 2 ranks)") != std::string::npos);
  const test::Run bj = test::k3flow(fmt::format("plan {} --ranks 2 --mem-gb 1 --context 16 --json", tiny));
  REQUIRE_MESSAGE(bj.code == 0, bj.err);
  CHECK(bj.out.find("{\"split\":{\"ranks\":2,") == 0);
  CHECK(bj.out.find(fmt::format("{{\"name\":\"expert exchange: send + receive (1 of 2 ranks)\",\"count\":2,"
                                "\"each\":{},\"bytes\":{}}}",
                                each, 2 * each)) != std::string::npos);
}

TEST_CASE("the prompt rank 0 read reaches every rank, whatever the others passed") {
  ranks::ThreadGroup group(3);
  std::vector<std::string> got(3);
  group.run([&](ranks::Comm& comm) {
    got[size_t(comm.rank())] =
        ranks::from_rank0(comm, comm.rank() == 0 ? "Write a haiku about disks. 世界" : "x");
  });
  for (const std::string& g : got) CHECK(g == "Write a haiku about disks. 世界");
  ranks::SingleComm one;
  CHECK(ranks::from_rank0(one, "alone") == "alone");
}

TEST_CASE(
    "per-rank streaming on the tiny oracle model: every rank's logits are the single process's, N = 1..4") {
  check_streamed(test::fixture_path("tiny-k3"), nullptr, {1, 17, 200, 3, 42, 99, 7}, 4);
}

TEST_CASE("per-rank streaming on a synthetic bf16 + MXFP4 checkpoint, shards and packed trunk: same bytes") {
  test::TempDir dir;
  const std::string model = dir / "m", packed = dir / "t";
  const test::Run s =
      test::k3flow(fmt::format("synth {} --size tiny --layers 6 --shards 2 --seed 11", model));
  REQUIRE_MESSAGE(s.code == 0, s.err);
  const test::Run p = test::k3flow(fmt::format("pack-trunk {} {}", model, packed));
  REQUIRE_MESSAGE(p.code == 0, p.err);
  check_streamed(model, nullptr, {3, 1, 4, 1, 5, 9, 2, 6}, 3);
  const Model m(model);
  const io::PackedTrunk trunk = io::PackedTrunk::open(packed, m.cfg.n_layers);
  check_streamed(model, &trunk, {3, 1, 4, 1, 5, 9, 2, 6}, 3);
}

TEST_CASE("the exchange is a node of a rank's graph only: its DOT node, edges and buffers") {
  const Model m(test::fixture_path("tiny-k3"));
  const auto src = pipeline::WeightSources::open(m.cfg, m.shards, nullptr, 0);
  const pipeline::PlanInputs in = src->plan_inputs(64, {});
  const pipeline::MemoryPlan plan = plan_for(in, 0.0, pipeline::Strategy::automatic);
  pipeline::GraphDescription one;
  decode_streamed(*src, plan, pipeline::Strategy::automatic, nullptr, {1, 2, 3}, 1, nullptr, &one);
  CHECK(one.to_dot().find("expert_exchange") == std::string::npos);
  CHECK(one.to_dot().find("exchange buffers") == std::string::npos);

  ranks::ThreadGroup group(2);
  std::vector<std::string> dots(2);
  group.run([&](ranks::Comm& comm) {
    ranks::RankExperts experts(comm);
    pipeline::PlanInputs rin = in;
    pipeline::plan_rank_experts(rin, m.cfg,
                                comm.rank() == 0 ? (m.cfg.n_experts + 1) / 2 : m.cfg.n_experts / 2, 2);
    pipeline::GraphDescription dot;
    decode_streamed(*src, plan_for(rin, 0.0, pipeline::Strategy::automatic), pipeline::Strategy::automatic,
                    &experts, {1, 2, 3}, 1, nullptr, &dot);
    dots[size_t(comm.rank())] = dot.to_dot();
  });
  for (const std::string& d : dots) {
    CHECK(d.find("\"expert_exchange\"") != std::string::npos);
    CHECK(d.find("\"exchange buffers\" -> \"expert_exchange\"") != std::string::npos);
    CHECK(d.find("\"expert_exchange\" -> \"combine\"") != std::string::npos);
    CHECK(d.find("\"expert_compute\" -> \"expert_exchange\"") != std::string::npos);
    CHECK(d.find("\"expert_compute\" -> \"combine\"") == std::string::npos);
  }
}
