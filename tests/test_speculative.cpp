// pipeline/run/speculative.*: prompt-lookup drafts and greedy speculative decoding. The product is
// exactness: with --spec N the emitted ids AND the logits of every emitted token are the bytes plain
// greedy decoding gives, resident and streamed, on fixtures/tiny-k3 and a synthetic MoE checkpoint,
// for N = 1, 3, 8, with prompts whose drafts hit and miss; the rejected rows of a verify pass leave
// nothing behind (KDA state restored and replayed, MLA rows forgotten), also when the caller stops in
// the middle of a pass.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <initializer_list>
#include <string>
#include <vector>

#include "io/error.hpp"
#include "pipeline/run/decoder.hpp"
#include "pipeline/run/draft_policy.hpp"
#include "pipeline/run/speculative.hpp"
#include "tests/run_helpers.hpp"

using namespace k3;
using k3::pipeline::Decoder;
using k3::pipeline::DecoderOptions;
using k3::pipeline::draft_lookup;
using k3::pipeline::SpecStats;

namespace {

const std::string kTiny = std::string(K3_FIXTURES) + "/tiny-k3";

using Ids = std::vector<int32_t>;

std::string bytes(std::span<const float> v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size_bytes());
}

DecoderOptions options(const std::string& model, const std::string& budget, int gen, size_t prompt) {
  DecoderOptions o;
  o.model_dir = model;
  o.capacity = prompt + size_t(gen) + 1;
  o.expected_calls = gen;
  o.stream.no_progress = true;
  if (budget == "ultra")
    o.stream.preset = "ultra";  // the floor: every layer through the ring
  else if (!budget.empty())
    o.stream.mem_gb = std::stod(budget);
  return o;
}

struct Out {
  Ids ids;
  std::vector<std::string> logits;  // per emitted token
  SpecStats stats;
};

// Plain greedy decoding: one pass per token.
Out plain(const DecoderOptions& o, const io::ModelConfig& cfg, const Ids& prompt, int gen,
          stages::SamplerOptions so = {}) {
  Decoder d(o, cfg);
  stages::Sampler sampler(so);
  d.push(prompt);
  Out r;
  for (int g = 0; g < gen; ++g) {
    const std::span<const float> l = d.logits();
    const int32_t next = sampler.next(l, d.seq());
    d.push(next);
    r.ids.push_back(next);
    r.logits.push_back(bytes(l));
  }
  return r;
}

// speculative_step until `gen` tokens; `stop_at` (if > 0) stops the emit callback once after that
// many tokens of a verify pass, the rest continuing speculatively (the decoder must then hold what
// plain decoding would).
Out spec(const DecoderOptions& o, const io::ModelConfig& cfg, const Ids& prompt, int gen, int n,
         stages::SamplerOptions so = {}, int stop_at = 0, const pipeline::DraftFn& drafter = {},
         pipeline::DraftPolicy* policy = nullptr) {
  Decoder d(o, cfg);
  stages::Sampler sampler(so);
  d.push(prompt);
  Out r;
  bool stopped = false;
  while (int(r.ids.size()) < gen) {
    int in_pass = 0;
    pipeline::speculative_step(
        d, sampler, n, gen - int(r.ids.size()), r.stats,
        [&](int32_t id, std::span<const float> l) {
          r.ids.push_back(id);
          r.logits.push_back(bytes(l));
          ++in_pass;
          if (stop_at > 0 && !stopped && in_pass == stop_at && r.stats.verifies > 0) {
            stopped = true;
            return false;
          }
          return true;
        },
        drafter, policy);
    REQUIRE(d.pending() == 1);
    REQUIRE(d.seq().size() == prompt.size() + r.ids.size());
  }
  return r;
}

void check_same(const Out& want, const Out& got) {
  REQUIRE(got.ids.size() == want.ids.size());
  CHECK(got.ids == want.ids);
  for (size_t i = 0; i < want.logits.size(); ++i) {
    CAPTURE(i);
    CHECK(got.logits[i] == want.logits[i]);
  }
}

// Drafts from the answer (plain decoding's ids): all right (`wrong` < 0), or with the draft at index
// `wrong` of every pass replaced, so that a pass accepts a prefix and rejects the rest. The random
// fixture models never copy their context, so prompt lookup alone would rarely be accepted.
pipeline::DraftFn oracle(const Ids& prompt, const Ids& answer, int wrong, int vocab) {
  Ids full = prompt;
  full.insert(full.end(), answer.begin(), answer.end());
  return [full, wrong, vocab](std::span<const int32_t> seq, size_t n) {
    REQUIRE(seq.size() <= full.size());
    REQUIRE(std::equal(seq.begin(), seq.end(), full.begin()));
    Ids d(full.begin() + std::ptrdiff_t(seq.size()),
          full.begin() + std::ptrdiff_t(std::min(full.size(), seq.size() + n)));
    if (wrong >= 0 && size_t(wrong) < d.size()) d[size_t(wrong)] = (d[size_t(wrong)] + 1) % vocab;
    return d;
  };
}

// A passage said twice (drafts hit once the repeat starts) and one without repeats (drafts miss
// until the generation itself repeats).
const Ids kRepetitive = {17, 203, 34, 2, 239, 195, 88, 61, 17, 203, 34, 2, 239, 195, 88, 61, 17, 203};
const Ids kPlain = {54, 121, 104, 16, 219, 63, 4, 31, 48, 193, 57};

// both_prompts false: only kPlain; ns: the draft counts (the streamed runs take fewer, to keep the
// test fast under the sanitizers).
void exact_for(const std::string& model, const std::string& budget, int gen, bool both_prompts = true,
               std::initializer_list<int> ns = {1, 3, 8}) {
  const io::ModelConfig cfg = pipeline::load_model_config(model, std::nullopt);
  for (const Ids* prompt : {&kRepetitive, &kPlain}) {
    if (!both_prompts && prompt == &kRepetitive) continue;
    const DecoderOptions o = options(model, budget, gen, prompt->size());
    const Out want = plain(o, cfg, *prompt, gen);
    for (const int n : ns) {
      CAPTURE(n);
      CAPTURE(prompt->size());
      const Out got = spec(o, cfg, *prompt, gen, n);
      check_same(want, got);
      CHECK(got.stats.emitted == uint64_t(gen));
      CHECK(got.stats.passes <= uint64_t(gen));
      // Every draft right: each pass emits n + 1 ids (the last pass fewer).
      const Out all = spec(o, cfg, *prompt, gen, n, {}, 0, oracle(*prompt, want.ids, -1, cfg.vocab));
      check_same(want, all);
      CHECK(all.stats.accepted == all.stats.drafted);
      CHECK(all.stats.passes ==
            1 + uint64_t((gen - 1 + n) / (n + 1)));  // the prompt's pass, then n + 1 a pass
      // One draft wrong in every pass: a prefix accepted, the rest rolled back.
      {
        const int wrong = n == 1 ? 0 : n - 1;  // all rejected (n = 1), or all but the last accepted
        CAPTURE(wrong);
        const Out part = spec(o, cfg, *prompt, gen, n, {}, 0, oracle(*prompt, want.ids, wrong, cfg.vocab));
        check_same(want, part);
        CHECK(part.stats.accepted < part.stats.drafted);
        if (wrong > 0) CHECK(part.stats.accepted > 0);
      }
    }
  }
}

// 8 layers (dense 0, MoE 1..7), 32 experts top-4, vocab 1024.
struct Synth {
  test::TempDir dir;
  std::string model;
  Synth() {
    model = dir / "m";
    const test::Run s = test::k3flow(fmt::format("synth {} --size tiny --layers 8 --seed 4", model));
    REQUIRE_MESSAGE(s.code == 0, s.err);
  }
};

Synth& synth() {
  static Synth s;
  return s;
}

}  // namespace

TEST_CASE("draft_lookup: the longest recent n-gram's continuation") {
  // Last 3 ids (1 2 3) occur at 0: what followed is 4 5 1 ...
  CHECK(draft_lookup(Ids{1, 2, 3, 4, 5, 1, 2, 3}, 4) == Ids{4, 5, 1, 2});
  CHECK(draft_lookup(Ids{1, 2, 3, 4, 5, 1, 2, 3}, 2) == Ids{4, 5});
  // The most recent occurrence wins: "7 8" followed by 1 at 0, by 2 at 4.
  CHECK(draft_lookup(Ids{7, 8, 1, 0, 7, 8, 2, 9, 7, 8}, 1) == Ids{2});
  // A 3-gram match beats a more recent 1-gram one: tail 5 6 7; 7 alone also occurs at 8.
  CHECK(draft_lookup(Ids{5, 6, 7, 40, 41, 9, 9, 9, 7, 50, 5, 6, 7}, 2) == Ids{40, 41});
  // Falls back to shorter n-grams: only "9" recurs.
  CHECK(draft_lookup(Ids{9, 3, 1, 2, 9}, 3) == Ids{3, 1, 2});
  // The continuation stops at the end of the sequence.
  CHECK(draft_lookup(Ids{4, 4, 4}, 5) == Ids{4});
  CHECK(draft_lookup(Ids{1, 2, 1, 2}, 8) == Ids{1, 2});
  // Nothing to find.
  CHECK(draft_lookup(Ids{1, 2, 3, 4}, 4).empty());
  CHECK(draft_lookup(Ids{}, 4).empty());
  CHECK(draft_lookup(Ids{5}, 4).empty());
  CHECK(draft_lookup(Ids{1, 1}, 0).empty());
  // max_ngram 1: only the last id is looked up.
  CHECK(draft_lookup(Ids{1, 2, 3, 9, 2, 3}, 1, 1) == Ids{9});
}

TEST_CASE("DecodeState::keep after a journaled pass: the state of feeding only the kept rows") {
  const io::ModelConfig cfg = pipeline::load_model_config(kTiny, std::nullopt);
  const io::ShardSet shards = io::ShardSet::open(kTiny);
  const auto model = stages::ResidentModel::load(shards, cfg, cfg.n_layers);
  stages::Scratch sc;
  const Ids prompt = {5, 9, 14, 3, 77}, extra = {12, 40, 41, 3, 9};
  std::vector<float> la(size_t(cfg.vocab) * 6), lb(size_t(cfg.vocab) * 6);
  for (size_t keep = 1; keep <= 6; ++keep) {
    CAPTURE(keep);
    stages::DecodeState a(cfg, cfg.n_layers, 32), b(cfg, cfg.n_layers, 32);
    stages::forward(*model, a, prompt, stages::HeadAt::last, la, sc);
    stages::forward(*model, b, prompt, stages::HeadAt::last, lb, sc);
    Ids rows = {7};
    rows.insert(rows.end(), extra.begin(), extra.end());
    a.begin_journal(rows.size());
    stages::forward(*model, a, rows, stages::HeadAt::all, la, sc);
    a.keep(keep);
    CHECK_FALSE(a.journaling());
    stages::forward(*model, b, std::span<const int32_t>(rows).first(keep), stages::HeadAt::last, lb, sc);
    REQUIRE(a.cached == b.cached);
    for (int l = 0; l < cfg.n_layers; ++l) {
      CAPTURE(l);
      CHECK(bytes(a.kda_layer(l)) == bytes(b.kda_layer(l)));
    }
    // The next token sees the same past either way.
    const Ids next = {100};
    stages::forward(*model, a, next, stages::HeadAt::last, la, sc);
    stages::forward(*model, b, next, stages::HeadAt::last, lb, sc);
    CHECK(bytes(std::span(la).first(size_t(cfg.vocab))) == bytes(std::span(lb).first(size_t(cfg.vocab))));
  }
  stages::DecodeState s(cfg, cfg.n_layers, 32);
  CHECK_THROWS_AS(s.keep(1), io::Error);  // no journaled pass
}

TEST_CASE("speculative greedy == plain greedy, ids and every emitted token's logits: tiny-k3 resident") {
  exact_for(kTiny, "", 24);
}

TEST_CASE("speculative greedy == plain greedy: tiny-k3 streamed at the floor") {
  exact_for(kTiny, "ultra", 16, false);
}

TEST_CASE("speculative greedy == plain greedy: synthetic MoE checkpoint, resident and streamed") {
  Synth& s = synth();
  exact_for(s.model, "", 12);
  exact_for(s.model, "ultra", 10, false);
  exact_for(s.model, "0.02", 10, false, {3});  // a middle budget: some layers pinned, experts cached
}

TEST_CASE("the drafting policy's drafts: the same bits as plain greedy decoding") {
  // The policy only chooses drafts, so every policy gives plain's ids and logits -- on the two
  // prompts and on P + O + P (O: what plain decoding continues P with), where lookup proposes O.
  const io::ModelConfig cfg = pipeline::load_model_config(kTiny, std::nullopt);
  const int gen = 24;
  // O: 128 ids. tiny-k3 continues this P + O + P with O (a shorter O it does not: its continuation
  // depends on the whole context), so there lookup's drafts are accepted, no oracle needed.
  const Out o = plain(options(kTiny, "", 128, kPlain.size()), cfg, kPlain, 128);
  Ids pop = kPlain;
  pop.insert(pop.end(), o.ids.begin(), o.ids.end());
  pop.insert(pop.end(), kPlain.begin(), kPlain.end());
  for (const Ids* prompt : std::initializer_list<const Ids*>{&kRepetitive, &kPlain, &pop}) {
    CAPTURE(prompt->size());
    const DecoderOptions opt = options(kTiny, "", gen, prompt->size());
    const Out want = plain(opt, cfg, *prompt, gen);
    for (const size_t min_match : {1, 2, 3})
      for (const bool adaptive : {true, false}) {
        CAPTURE(min_match);
        CAPTURE(adaptive);
        pipeline::DraftPolicyOptions po;
        po.max_drafts = 4;
        po.min_match = min_match;
        po.adaptive = adaptive;
        pipeline::DraftPolicy policy(po);
        const Out got = spec(opt, cfg, *prompt, gen, 4, {}, 0, {}, &policy);
        check_same(want, got);
        CHECK(got.stats.emitted == uint64_t(gen));
        CHECK(got.stats.passes == got.stats.emitted - got.stats.accepted);
        if (prompt == &pop) {
          CHECK(std::equal(want.ids.begin(), want.ids.end(), o.ids.begin()));
          CHECK(got.stats.accepted >= uint64_t(gen) / 2);
        }
      }
  }
}

TEST_CASE("a caller that stops mid-pass leaves the decoder where plain decoding would be") {
  const io::ModelConfig cfg = pipeline::load_model_config(kTiny, std::nullopt);
  for (const std::string budget : {"", "ultra"}) {
    CAPTURE(budget);
    const int gen = 20;
    const DecoderOptions o = options(kTiny, budget, gen, kRepetitive.size());
    const Out want = plain(o, cfg, kRepetitive, gen);
    for (const int stop_at : {1, 2}) {
      CAPTURE(stop_at);
      check_same(
          want, spec(o, cfg, kRepetitive, gen, 8, {}, stop_at, oracle(kRepetitive, want.ids, -1, cfg.vocab)));
      check_same(want,
                 spec(o, cfg, kRepetitive, gen, 8, {}, stop_at, oracle(kRepetitive, want.ids, 5, cfg.vocab)));
    }
  }
}

TEST_CASE("a repeat penalty: each verify row is judged with its own context") {
  const io::ModelConfig cfg = pipeline::load_model_config(kTiny, std::nullopt);
  stages::SamplerOptions so;
  so.repeat_penalty = 1.3;
  so.repeat_last_n = 8;
  const int gen = 20;
  const DecoderOptions o = options(kTiny, "", gen, kRepetitive.size());
  const Out want = plain(o, cfg, kRepetitive, gen, so);
  check_same(want, spec(o, cfg, kRepetitive, gen, 4, so));
  check_same(want, spec(o, cfg, kRepetitive, gen, 4, so, 0, oracle(kRepetitive, want.ids, 2, cfg.vocab)));
}

TEST_CASE("speculative_step refuses sampling") {
  const io::ModelConfig cfg = pipeline::load_model_config(kTiny, std::nullopt);
  Decoder d(options(kTiny, "", 4, 3), cfg);
  d.push(Ids{1, 2, 3});
  stages::SamplerOptions so;
  so.temperature = 0.7;
  stages::Sampler sampler(so);
  SpecStats st;
  CHECK_THROWS_WITH_AS(
      pipeline::speculative_step(d, sampler, 4, 4, st, [](int32_t, std::span<const float>) { return true; }),
      doctest::Contains("--spec"), io::Error);
}
