// pipeline/run/batch_engine.*: several sequences in one engine, a step being ONE pass over the model
// for all of them. Sequences of different lengths join and leave between steps (a prompt fed in the
// step it joins, then one id per step, greedy), and every step's logits must be the bytes a Decoder
// produces for that sequence alone:
//   - fixtures/tiny-k3, resident and streamed at the floor (against the solo run of the same kind);
//   - a synthetic MoE checkpoint (`k3flow synth`: 32 experts top-4, so a step's union of experts
//     exceeds the floor's expert slots and runs in waves) streamed at the floor and at a middle
//     budget, strategies serial / overlap / lookahead / auto, 1 and 2 threads, against the resident
//     solo run;
//   - a step whose ids exceed the pass cap is split (chunked prefill), same bytes;
//   - the prefill policy (plan_step): a joining prompt inline in the decode step or in a step of its
//     own, whole or chunked across steps, same bytes;
//   - every trunk layer is read once per step whatever the number of sequences;
//   - bad rows are refused before any state changes.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "io/error.hpp"
#include "kernels/argmax.hpp"
#include "pipeline/run/batch_engine.hpp"
#include "pipeline/run/decoder.hpp"
#include "pipeline/run/thread_limit.hpp"
#include "tests/run_helpers.hpp"

using namespace k3;
using k3::pipeline::BatchEngine;
using k3::pipeline::Decoder;
using k3::pipeline::DecoderOptions;

namespace {

const std::string kTiny = std::string(K3_FIXTURES) + "/tiny-k3";

DecoderOptions options(const std::string& model, bool streamed) {
  DecoderOptions o;
  o.model_dir = model;
  o.capacity = 64;
  o.stream.no_progress = true;
  if (streamed) o.stream.preset = "ultra";  // the floor: every layer through the ring
  return o;
}

struct Seq {
  std::vector<int32_t> prompt;
  int join = 0, gen = 0;  // the step it joins at (or the first after with a free slot); ids it generates
  int slot = -1, done = 0;
  bool left = false;
  std::vector<int32_t> pending;  // the prompt's ids not yet fed, or the id sampled last
  bool prompting = true;
  std::vector<float> logits;
  std::vector<std::string> got;
};

// Four sequences over three slots: two join at once, one leaves early and a later one reuses its
// slot, a long prompt joins while two others decode.
std::vector<Seq> scenario() {
  std::vector<Seq> seqs(4);
  seqs[0].prompt = {203, 34, 2, 239, 195}, seqs[0].join = 0, seqs[0].gen = 6;
  seqs[1].prompt = {71, 163}, seqs[1].join = 0, seqs[1].gen = 3;  // leaves early: the 4th reuses its slot
  seqs[2].prompt = {54, 121, 104, 16, 16, 219, 63, 4, 31, 48, 193, 57}, seqs[2].join = 2, seqs[2].gen = 4;
  seqs[3].prompt = {4, 31, 48}, seqs[3].join = 5, seqs[3].gen = 3;
  return seqs;
}

// A sequence alone: the logits of every step (prompt, then `gen` greedy ids), as bytes.
std::vector<std::string> solo(const DecoderOptions& base, const io::ModelConfig& cfg, const Seq& s) {
  DecoderOptions o = base;
  o.expected_calls = s.gen + 1;
  Decoder d(o, cfg);
  d.push(s.prompt);
  std::vector<std::string> out;
  for (int i = 0; i <= s.gen; ++i) {
    std::span<const float> l = d.logits();
    out.emplace_back(reinterpret_cast<const char*>(l.data()), l.size_bytes());
    d.push(int32_t(kernels::argmax(l)));
  }
  return out;
}

using Solos = std::vector<std::vector<std::string>>;

Solos solos(const DecoderOptions& o, const io::ModelConfig& cfg) {
  Solos out;
  for (const Seq& s : scenario()) out.push_back(solo(o, cfg, s));
  return out;
}

struct ScenarioRun {
  std::vector<int> passes;  // per step
  int mixed_steps = 0;      // steps that fed a prompt beside a decoding sequence's id
  int skips = 0;            // a decoding sequence left out of a step (separate prefill)
  int partial = 0;          // a prompt fed in part (chunked across steps)
};

// Runs the scenario on `eng`, each step's rows chosen by eng.plan_step() (the engine's prefill
// policy); checks every sampled position's logits against `want`.
ScenarioRun run_scenario(BatchEngine& eng, const io::ModelConfig& cfg, const Solos& want) {
  std::vector<Seq> seqs = scenario();
  REQUIRE(eng.max_seqs() == 3);
  std::vector<bool> busy(3, false);
  ScenarioRun run;
  for (int step = 0; step < 64; ++step) {
    std::vector<BatchEngine::Pending> pending;
    std::vector<Seq*> who;
    for (Seq& s : seqs) {
      if (s.join <= step && s.slot < 0 && !s.left) {
        const auto free = std::find(busy.begin(), busy.end(), false);
        if (free == busy.end()) continue;  // waits for a slot
        s.slot = int(free - busy.begin());
        busy[size_t(s.slot)] = true;
        eng.reset(s.slot);
        s.logits.resize(size_t(cfg.vocab));
        s.pending = s.prompt;
      }
      if (s.slot < 0 || s.left) continue;
      pending.push_back({.seq = s.slot, .ids = s.pending.size(), .prompt = s.prompting});
      who.push_back(&s);
    }
    if (who.empty()) continue;
    const std::vector<size_t> feed = eng.plan_step(pending);
    REQUIRE(feed.size() == who.size());
    std::vector<BatchEngine::Row> rows;
    bool prompt_fed = false, decode_fed = false;
    for (size_t i = 0; i < who.size(); ++i) {
      REQUIRE(feed[i] <= who[i]->pending.size());
      if (feed[i] == 0) {
        CHECK(!who[i]->prompting);  // only a decoding sequence skips a step
        ++run.skips;
        continue;
      }
      (who[i]->prompting ? prompt_fed : decode_fed) = true;
      if (feed[i] < who[i]->pending.size()) ++run.partial;
      rows.push_back(
          {who[i]->slot, std::span<const int32_t>(who[i]->pending).first(feed[i]), who[i]->logits});
    }
    REQUIRE(!rows.empty());
    run.mixed_steps += prompt_fed && decode_fed;
    eng.step(rows);
    run.passes.push_back(eng.passes_last_step());
    for (size_t i = 0; i < who.size(); ++i) {
      Seq& s = *who[i];
      if (feed[i] == 0) continue;
      s.pending.erase(s.pending.begin(), s.pending.begin() + long(feed[i]));
      if (!s.pending.empty()) continue;  // the prompt's rest comes in a later step
      s.prompting = false;
      s.got.emplace_back(reinterpret_cast<const char*>(s.logits.data()), s.logits.size() * 4);
      s.pending.assign(1, int32_t(kernels::argmax(s.logits)));
      if (++s.done > s.gen) {  // leaves: the slot is free next step
        busy[size_t(s.slot)] = false;
        s.left = true;
      }
    }
  }
  for (size_t k = 0; k < seqs.size(); ++k) {
    const Seq& s = seqs[k];
    CAPTURE(k);
    REQUIRE(s.done == s.gen + 1);
    REQUIRE(s.got.size() == want[k].size());
    for (size_t i = 0; i < want[k].size(); ++i) {
      CAPTURE(i);
      CHECK(s.got[i] == want[k][i]);
    }
  }
  return run;
}

void run_batched(bool streamed) {
  const io::ModelConfig cfg = pipeline::load_model_config(kTiny, std::nullopt);
  const Solos want = solos(options(kTiny, streamed), cfg);
  BatchEngine eng(options(kTiny, streamed), cfg, 3);
  const ScenarioRun run = run_scenario(eng, cfg, want);
  CHECK(std::all_of(run.passes.begin(), run.passes.end(), [](int p) { return p == 1; }));
  CHECK(run.mixed_steps > 0);  // inline by default: the long prompt joins beside two decoding ids
  CHECK(run.skips == 0);
}

// 8 layers (dense 0, MoE 1..7), 32 experts top-4, vocab 1024: ~14 MB.
struct Synth {
  test::TempDir dir;
  std::string model;
  io::ModelConfig cfg;
  Solos want;  // resident, each sequence alone
  Synth() {
    model = dir / "m";
    const test::Run s = test::k3flow(fmt::format("synth {} --size tiny --layers 8 --seed 4", model));
    REQUIRE_MESSAGE(s.code == 0, s.err);
    cfg = pipeline::load_model_config(model, std::nullopt);
    want = solos(options(model, false), cfg);
  }
};

Synth& synth() {
  static Synth s;
  return s;
}

}  // namespace

TEST_CASE("batched sequences joining and leaving: every step's logits are the solo run's bytes (resident)") {
  run_batched(false);
}

TEST_CASE(
    "batched sequences joining and leaving: every step's logits are the solo run's bytes (streamed, floor)") {
  run_batched(true);
}

TEST_CASE(
    "synthetic MoE checkpoint: batched steps streamed == solo resident bytes, every strategy, budget, "
    "thread count") {
  Synth& s = synth();
  for (const int threads : {1, 2}) {
    const pipeline::ThreadLimit limit(threads);
    for (const char* budget : {"ultra", "0.02"})
      for (const char* strategy : {"serial", "overlap", "lookahead", "auto"}) {
        CAPTURE(threads);
        CAPTURE(budget);
        CAPTURE(strategy);
        DecoderOptions o = options(s.model, true);
        if (std::string(budget) == "ultra") {
          o.stream.preset = budget;
        } else {
          o.stream.preset.clear();
          o.stream.mem_gb = std::stod(budget);
        }
        o.stream.strategy = strategy;
        o.stream.threads = limit.threads();
        BatchEngine eng(o, s.cfg, 3);
        run_scenario(eng, s.cfg, s.want);
      }
  }
}

TEST_CASE("a step over the pass cap is split (chunked prefill): the same bytes, resident and streamed") {
  Synth& s = synth();
  for (const bool streamed : {false, true}) {
    CAPTURE(streamed);
    BatchEngine eng(options(s.model, streamed), s.cfg, 3);
    CHECK(eng.max_step_rows() == 64);
    eng.set_max_step_rows(4);
    const std::vector<int> passes = run_scenario(eng, s.cfg, s.want).passes;
    // Step 2 feeds two decoding ids and a 12-id prompt: 14 ids in passes of 4.
    REQUIRE(passes.size() > 2);
    CHECK(passes[0] == 2);  // two prompts, 5 + 2 ids
    CHECK(passes[2] == 4);
    CHECK(*std::max_element(passes.begin(), passes.end()) == 4);
    CHECK_THROWS_AS(eng.set_max_step_rows(0), io::Error);
    CHECK_THROWS_AS(eng.set_max_step_rows(65), io::Error);
  }
}

TEST_CASE(
    "plan_step: inline feeds everyone, separate gives the prompts a step of their own, chunk caps them") {
  const io::ModelConfig cfg = pipeline::load_model_config(kTiny, std::nullopt);
  BatchEngine eng(options(kTiny, false), cfg, 3);
  using Mode = pipeline::PrefillPolicy::Mode;
  CHECK(eng.prefill().mode == Mode::inline_decode);
  CHECK(eng.prefill().chunk == 0);
  const std::vector<BatchEngine::Pending> mixed = {{.seq = 0, .ids = 1, .prompt = false},
                                                   {.seq = 1, .ids = 12, .prompt = true},
                                                   {.seq = 2, .ids = 1, .prompt = false}};
  const std::vector<BatchEngine::Pending> decoding = {{.seq = 0, .ids = 1, .prompt = false},
                                                      {.seq = 2, .ids = 1, .prompt = false}};
  CHECK(eng.plan_step(mixed) == std::vector<size_t>{1, 12, 1});
  eng.set_prefill({.mode = Mode::inline_decode, .chunk = 5});
  CHECK(eng.plan_step(mixed) == std::vector<size_t>{1, 5, 1});
  eng.set_prefill({.mode = Mode::separate, .chunk = 0});
  CHECK(eng.plan_step(mixed) == std::vector<size_t>{0, 12, 0});
  CHECK(eng.plan_step(decoding) == std::vector<size_t>{1, 1});
  eng.set_prefill({.mode = Mode::separate, .chunk = 5});
  CHECK(eng.plan_step(mixed) == std::vector<size_t>{0, 5, 0});
  CHECK(pipeline::parse_prefill_mode("separate", "--prefill") == Mode::separate);
  CHECK(std::string(pipeline::prefill_mode_name(Mode::inline_decode)) == "inline");
  CHECK_THROWS_WITH_AS(pipeline::parse_prefill_mode("both", "--prefill"), doctest::Contains("--prefill"),
                       io::Error);
}

TEST_CASE("a joining prompt inline or in a step of its own, whole or chunked across steps: the solo bytes") {
  using Mode = pipeline::PrefillPolicy::Mode;
  const std::vector<pipeline::PrefillPolicy> policies = {{.mode = Mode::separate, .chunk = 0},
                                                         {.mode = Mode::inline_decode, .chunk = 4},
                                                         {.mode = Mode::separate, .chunk = 5},
                                                         {.mode = Mode::inline_decode, .chunk = 1}};
  const auto check_policies = [&](const std::string& model, const DecoderOptions& o, const Solos& want) {
    const io::ModelConfig cfg = pipeline::load_model_config(model, std::nullopt);
    for (const pipeline::PrefillPolicy& p : policies) {
      CAPTURE(pipeline::prefill_mode_name(p.mode));
      CAPTURE(p.chunk);
      BatchEngine eng(o, cfg, 3);
      eng.set_prefill(p);
      const ScenarioRun run = run_scenario(eng, cfg, want);
      if (p.mode == Mode::separate) {
        CHECK(run.mixed_steps == 0);
        CHECK(run.skips > 0);
      } else {
        CHECK(run.mixed_steps > 0);
        CHECK(run.skips == 0);
      }
      if (p.chunk > 0)
        CHECK(run.partial > 0);  // the 12-id prompt (and the 5-id one) fed over several steps
      else
        CHECK(run.partial == 0);
    }
  };
  SUBCASE("tiny-k3 resident") {
    const io::ModelConfig cfg = pipeline::load_model_config(kTiny, std::nullopt);
    check_policies(kTiny, options(kTiny, false), solos(options(kTiny, false), cfg));
  }
  SUBCASE("synthetic MoE checkpoint streamed at 0.02 GiB against the resident solo run") {
    Synth& s = synth();
    DecoderOptions o = options(s.model, true);
    o.stream.preset.clear();
    o.stream.mem_gb = 0.02;
    check_policies(s.model, o, s.want);
  }
}

TEST_CASE("a batched step reads every trunk layer once, whatever the number of sequences") {
  Synth& s = synth();
  // The floor: no layer pinned, every layer read every step. Reads run ahead into the next step
  // (as far as free ring slots allow), so totals are compared over several steps: a pass per
  // sequence would read three times as much.
  const auto trunk_read = [&](int n_seqs) {
    BatchEngine eng(options(s.model, true), s.cfg, 3);
    std::vector<std::vector<float>> logits(3, std::vector<float>(size_t(s.cfg.vocab)));
    std::vector<int32_t> next(3);
    for (int step = 0; step < 6; ++step) {
      std::vector<BatchEngine::Row> rows;
      for (int q = 0; q < n_seqs; ++q) {
        next[size_t(q)] = step == 0 ? int32_t(10 + q) : int32_t(kernels::argmax(logits[size_t(q)]));
        rows.push_back({q, std::span<const int32_t>(&next[size_t(q)], 1), logits[size_t(q)]});
      }
      eng.step(rows);
      CHECK(eng.passes_last_step() == 1);
    }
    return eng.stream()->totals().trunk_bytes_read;
  };
  const uint64_t one = trunk_read(1), three = trunk_read(3);
  CAPTURE(one);
  CAPTURE(three);
  REQUIRE(one > 0);
  CHECK(double(three) <= 1.25 * double(one));
  CHECK(double(three) >= 0.75 * double(one));
}

TEST_CASE("a bad row is refused, naming its slot, before any state changes") {
  const io::ModelConfig cfg = pipeline::load_model_config(kTiny, std::nullopt);
  BatchEngine eng(options(kTiny, false), cfg, 2);
  std::vector<float> a(size_t(cfg.vocab)), b(size_t(cfg.vocab));
  const std::vector<int32_t> good = {1, 2, 3}, bad = {1, cfg.vocab};
  const std::vector<BatchEngine::Row> rows = {{0, good, a}, {1, bad, b}};
  CHECK_THROWS_WITH_AS(eng.step(rows), doctest::Contains("sequence 1"), io::Error);
  CHECK(eng.cached(0) == 0);
  const std::vector<BatchEngine::Row> twice = {{0, good, a}, {0, good, b}};
  CHECK_THROWS_WITH_AS(eng.step(twice), doctest::Contains("twice"), io::Error);
  const std::vector<BatchEngine::Row> outside = {{2, good, a}};
  CHECK_THROWS_WITH_AS(eng.step(outside), doctest::Contains("slot 2"), io::Error);
  CHECK_THROWS_AS(BatchEngine(options(kTiny, false), cfg, 0), io::Error);
  eng.step(std::vector<BatchEngine::Row>{{0, good, a}});
  CHECK(eng.cached(0) == 3);
  CHECK(eng.cached(1) == 0);
}
