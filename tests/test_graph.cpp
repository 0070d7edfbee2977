// pipeline/graph/graph.* (with slot_pool, expert_cache, streaming_source) in process: the streamed
// forward pass gives the resident forward pass's logits BIT FOR BIT on a synthetic checkpoint with
// several MoE layers and two MLA layers, for every strategy, for budgets from the plan floor to
// everything resident, from the shards and from a packed trunk, 1 and 2 threads, full recompute and
// incremental, single tokens and multi-token prefill (expert waves at the floor).
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <cstring>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "io/config.hpp"
#include "io/packed_trunk.hpp"
#include "io/safetensors.hpp"
#include "io/synth/synth.hpp"
#include "pipeline/graph/expert_cache.hpp"
#include "pipeline/graph/graph.hpp"
#include "pipeline/graph/planner.hpp"
#include "pipeline/graph/streaming_source.hpp"
#include "pipeline/run/thread_limit.hpp"
#include "stages/bind.hpp"
#include "stages/forward.hpp"
#include "stages/head.hpp"
#include "tests/temp_dir.hpp"

namespace fs = std::filesystem;
using namespace k3;

using k3::test::TempDir;

namespace {

// 8 layers: dense layer 0, MoE 1..7, MLA at 3 and 7 (one-based 4, 8), 32 experts of which 4 per token.
io::ModelConfig test_dims() {
  io::ModelConfig c = io::synth::preset_dims("tiny");
  c.n_layers = 8;
  c.full_attn_layers = io::synth::default_full_attn(8);
  return c;
}

struct Checkpoint {
  TempDir dir;
  fs::path model, trunk;
  Checkpoint() {
    model = dir.path / "m";
    trunk = dir.path / "t";
    io::synth::SynthOptions o;
    o.seed = 21;
    io::synth::write_checkpoint(io::synth::layout_dense(test_dims(), 3), model, o);
    const io::ShardSet shards = io::ShardSet::open(model);
    io::pack_trunk(shards, test_dims().n_layers, trunk);
  }
};

Checkpoint& checkpoint() {
  static Checkpoint c;
  return c;
}

const std::vector<int32_t> kPrompt = {5, 900, 17, 17, 3, 640, 201, 88, 1000, 42};

// Greedy decode of `gen` tokens; returns every step's logits, concatenated.
template <class Forward>
std::vector<float> decode(const io::ModelConfig& c, bool incremental, int gen, Forward&& fwd) {
  const int n = c.n_layers;
  stages::DecodeState st(c, n, kPrompt.size() + size_t(gen) + 1);
  std::vector<int32_t> seq = kPrompt;
  std::vector<float> logits(size_t(c.vocab)), all;
  for (int g = 0; g < gen; ++g) {
    std::span<const int32_t> feed;
    if (incremental) {
      feed = std::span<const int32_t>(seq).subspan(st.cached);
    } else {
      st.reset();
      feed = seq;
    }
    fwd(st, feed, std::span<float>(logits));
    all.insert(all.end(), logits.begin(), logits.end());
    seq.push_back(stages::greedy(logits));
  }
  return all;
}

std::vector<float> resident(bool incremental, int gen) {
  Checkpoint& ck = checkpoint();
  const io::ModelConfig c = io::load_config(ck.model / "config.json");
  const io::ShardSet shards = io::ShardSet::open(ck.model);
  auto model = stages::ResidentModel::load(shards, c);
  stages::Scratch scratch;
  return decode(c, incremental, gen,
                [&](stages::DecodeState& st, std::span<const int32_t> ids, std::span<float> lg) {
                  stages::forward(*model, st, ids, stages::HeadAt::last, lg, scratch);
                });
}

struct Streamed {
  std::vector<float> logits;
  pipeline::StreamTotals totals;
  pipeline::MemoryPlan plan;
};

// budget: 0 = the floor, else bytes. `before` runs on the built model before the decode.
Streamed streamed(pipeline::Strategy s, uint64_t budget, bool use_trunk, bool incremental, int gen,
                  const std::function<void(pipeline::StreamingModel&, const io::ModelConfig&)>& before = {},
                  int threads = 0) {
  Checkpoint& ck = checkpoint();
  const io::ModelConfig c = io::load_config(ck.model / "config.json");
  const io::ShardSet shards = io::ShardSet::open(ck.model);
  std::optional<io::PackedTrunk> trunk;
  if (use_trunk) trunk.emplace(io::PackedTrunk::open(ck.trunk, c.n_layers));
  auto src = pipeline::WeightSources::open(c, shards, trunk ? &*trunk : nullptr, 0);
  const pipeline::PlanInputs in = src->plan_inputs(64, {});
  pipeline::PlanBudget b;
  b.total = budget ? budget : pipeline::plan_floor(in);
  b.lookahead = s == pipeline::Strategy::lookahead;
  b.source = "test";
  Streamed out;
  out.plan = pipeline::make_plan(in, b);
  pipeline::StreamingModel m(*src, out.plan, s, nullptr, nullptr, pipeline::kDefaultExpertPolicy, threads);
  if (before) before(m, c);
  m.expect_calls(gen);
  out.logits = decode(c, incremental, gen,
                      [&](stages::DecodeState& st, std::span<const int32_t> ids, std::span<float> lg) {
                        m.forward(st, ids, lg);
                      });
  out.totals = m.totals();
  return out;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

const pipeline::Strategy kStrategies[] = {pipeline::Strategy::serial, pipeline::Strategy::trunk,
                                          pipeline::Strategy::overlap, pipeline::Strategy::lookahead};

}  // namespace

TEST_CASE("streamed == resident, bit for bit: every strategy, floor to everything, shards and packed trunk") {
  const std::vector<float> ref_inc = resident(true, 4), ref_full = resident(false, 3);
  for (bool use_trunk : {false, true})
    for (uint64_t budget : {uint64_t(0), uint64_t(20) << 20, uint64_t(1) << 30})
      for (pipeline::Strategy s : kStrategies) {
        CAPTURE(use_trunk);
        CAPTURE(budget);
        CAPTURE(pipeline::strategy_name(s));
        const Streamed inc = streamed(s, budget, use_trunk, true, 4);
        CHECK(same_bits(inc.logits, ref_inc));
        CHECK(inc.totals.uring_bytes + inc.totals.pread_bytes ==
              inc.totals.trunk_bytes_read + inc.totals.expert_bytes_read);
        if (budget == 0) {
          CHECK(inc.plan.ring_slots == 2);
          CHECK(inc.plan.pinned.empty());
        }
        if (budget == uint64_t(1) << 30) CHECK(inc.plan.ring_slots == 0);  // everything pinned
        const Streamed full = streamed(s, budget, use_trunk, false, 3);
        CHECK(same_bits(full.logits, ref_full));
      }
}

TEST_CASE(
    "a streamed forward refuses bad ids and a full KV cache before it starts, then decodes the same bits") {
  int refused = 0;
  const Streamed out =
      streamed(pipeline::Strategy::overlap, 0, false, true, 3,
               [&](pipeline::StreamingModel& m, const io::ModelConfig& c) {
                 std::vector<float> lg(size_t(c.vocab));
                 stages::DecodeState st(c, c.n_layers, 4);
                 const std::vector<int32_t> bad = {5, c.vocab}, negative = {-1}, five = {1, 2, 3, 4, 5};
                 CHECK_THROWS_WITH_AS(m.forward(st, bad, lg),
                                      doctest::Contains(fmt::format("token id {} outside", c.vocab).c_str()),
                                      io::Error);
                 CHECK_THROWS_WITH_AS(m.forward(st, negative, lg), doctest::Contains("token id -1 outside"),
                                      io::Error);
                 CHECK_THROWS_WITH_AS(m.forward(st, {}, lg), doctest::Contains("no tokens"), io::Error);
                 CHECK_THROWS_WITH_AS(m.forward(st, five, lg),
                                      doctest::Contains("KV cache overflow: 5 positions"), io::Error);
                 CHECK(st.cached == 0);
                 refused = 4;
               });
  CHECK(refused == 4);
  CHECK(same_bits(out.logits, resident(true, 3)));
}

TEST_CASE("1 and 2 threads give the same bits") {
  const std::vector<float> ref = resident(true, 3);
  for (int threads : {1, 2}) {
    CAPTURE(threads);
    // The command's way: the process capped, and the graph's arena given the same count.
    const pipeline::ThreadLimit limit(threads);
    for (pipeline::Strategy s : kStrategies) {
      CAPTURE(pipeline::strategy_name(s));
      CHECK(same_bits(streamed(s, 0, false, true, 3, {}, limit.threads()).logits, ref));
    }
  }
}

TEST_CASE("a prefill needing more experts than slots runs in waves; lookahead counts predictions") {
  // 10 prompt tokens x top-4 of 32 experts touch far more than the floor's 4 expert slots.
  const Streamed floor = streamed(pipeline::Strategy::trunk, 0, false, true, 2);
  CHECK(floor.plan.inflight_slots + floor.plan.lookahead_slots + floor.plan.cache_slots < 16);
  CHECK(same_bits(floor.logits, resident(true, 2)));
  CHECK(floor.totals.expert_requests > 0);

  const Streamed la = streamed(pipeline::Strategy::lookahead, uint64_t(20) << 20, false, true, 6);
  CHECK(la.totals.lookahead_predicted > 0);
  CHECK(la.totals.lookahead_used <= la.totals.lookahead_predicted);
  CHECK(la.totals.expert_hits <= la.totals.expert_requests);
}

TEST_CASE("expert cache: LRU victims, pinned slots are never victims, INFLIGHT is never read twice") {
  pipeline::ExpertCache cache(2, 4096, 0, 2, 4);
  using F = pipeline::ExpertCache::Found;
  auto a = cache.request(0, 0, 7);
  CHECK(a.found == F::claimed);
  auto b = cache.prefetch(0, 1);
  CHECK(b.found == F::claimed);
  CHECK(b.slot != a.slot);
  CHECK(cache.prefetch(0, 2).found == F::full);  // one pinned, one INFLIGHT
  auto again = cache.request(0, 1, 9);           // the prefetch is still being read: wait for it
  CHECK(again.found == F::inflight);
  CHECK(again.was_prefetch);
  CHECK(cache.landed(b.slot, true) == 9);
  CHECK(cache.landed(a.slot, true) == 7);
  CHECK(cache.request(1, 0, 0).found == F::full);  // both pinned
  CHECK(cache.release(a.slot));
  auto c = cache.request(1, 0, 0);  // evicts (0, 0), the only unpinned slot
  CHECK(c.found == F::claimed);
  CHECK(c.slot == a.slot);
  CHECK(cache.release(b.slot));
  CHECK(cache.request(0, 1, 0).found == F::ready);  // still resident
}
