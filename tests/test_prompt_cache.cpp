// The prompt cache (pipeline/serve/prompt_cache.*, BatchEngine::snapshot / restore, the scheduler's
// use of them, serve --prompt-cache-gb):
//   - PromptCache alone: the longest held proper prefix, its budget and what it evicts first;
//   - a slot restored from a snapshot and fed the rest of a prompt gives the logits bytes a lone
//     Decoder gives for the whole prompt, and so does every greedy step after (fixtures/tiny-k3,
//     resident and streamed at the floor), including a snapshot taken between two passes of a step;
//   - the scheduler with the cache: requests sharing prefixes (a turn that extends an earlier one's
//     prompt and reply, one sharing the first pass, a repeat, one sharing most of a longer prompt
//     whose boundary snapshots are spaced by doubling) get the ids a lone run gives, and report the
//     prefix they resumed from;
//   - `k3flow serve --prompt-cache-gb`: usage.prompt_tokens_details.cached_tokens and the /metrics
//     counters, over HTTP; `k3flow plan` holds the budget as a term.
#include <doctest/doctest.h>
#include <simdjson.h>

#include <chrono>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/argmax.hpp"
#include "pipeline/run/batch_engine.hpp"
#include "pipeline/run/decoder.hpp"
#include "pipeline/run/model_tokenizer.hpp"
#include "pipeline/serve/prompt_cache.hpp"
#include "pipeline/serve/scheduler.hpp"
#include "stages/sampler.hpp"
#include "tests/run_helpers.hpp"
#include "tests/test_serve_client.hpp"

using namespace k3;
using namespace std::chrono_literals;
using k3::pipeline::BatchEngine;
using k3::pipeline::serve::PromptCache;

namespace {

const std::string kTiny = std::string(K3_FIXTURES) + "/tiny-k3";

// A snapshot of `positions` positions whose state is `floats` floats (PromptCache never reads them).
BatchEngine::Snapshot fake(size_t positions, size_t floats) {
  BatchEngine::Snapshot s;
  s.positions = positions;
  s.kv.assign(floats, 1.0f);
  return s;
}

std::vector<int32_t> iota_ids(size_t n, int32_t first = 1) {
  std::vector<int32_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = first + int32_t(i);
  return v;
}

pipeline::DecoderOptions dec_options(size_t capacity, bool streamed) {
  pipeline::DecoderOptions o;
  o.model_dir = kTiny;
  o.capacity = capacity;
  o.stream.no_progress = true;
  if (streamed) o.stream.preset = "ultra";  // the floor: every layer through the ring
  return o;
}

std::string bytes_of(std::span<const float> v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size_bytes());
}

// A lone Decoder fed `prompt` whole, then `gen` greedy ids: the logits of each call, as bytes.
std::vector<std::string> solo_logits(const io::ModelConfig& cfg, const std::vector<int32_t>& prompt, int gen,
                                     bool streamed) {
  pipeline::DecoderOptions o = dec_options(prompt.size() + size_t(gen) + 1, streamed);
  o.expected_calls = gen + 1;
  pipeline::Decoder d(o, cfg);
  d.push(prompt);
  std::vector<std::string> out;
  for (int i = 0; i <= gen; ++i) {
    const std::span<const float> l = d.logits();  // feeds what is pending
    out.push_back(bytes_of(l));
    if (i < gen) d.push(int32_t(kernels::argmax(l)));
  }
  return out;
}

// A tiny-k3 prompt of `n` ids inside its vocabulary, varied by `salt`.
std::vector<int32_t> prompt_ids(size_t n, int salt, int vocab) {
  std::vector<int32_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = int32_t((i * 37 + size_t(salt) * 11 + 3) % size_t(vocab - 1));
  return v;
}

}  // namespace

TEST_CASE(
    "PromptCache: the longest held proper prefix, within its budget, the least valuable evicted first") {
  // Each entry's bytes: 4 per state float + 4 per id. Room for the first two, or for the longer of
  // them and the third (below), not for all three.
  PromptCache c(4 * (100 + 10) + 4 * (200 + 20) + 320);
  const std::vector<int32_t> p = iota_ids(30);
  CHECK(c.lookup(p) == nullptr);
  CHECK(c.insert(std::span(p).first(10), fake(10, 100)));
  CHECK(c.insert(std::span(p).first(20), fake(20, 200)));
  CHECK(c.bytes() == 4 * 110 + 4 * 220);
  CHECK_FALSE(c.insert(std::span(p).first(20), fake(20, 200)));  // held already
  CHECK_FALSE(c.make_room(std::span(p).first(5), c.budget()));   // larger than the whole budget

  const BatchEngine::Snapshot* hit = c.lookup(p);  // both are prefixes: the longer wins
  REQUIRE(hit != nullptr);
  CHECK(hit->positions == 20);
  hit = c.lookup(std::span(p).first(20));  // a snapshot of the whole prompt leaves no id to feed
  REQUIRE(hit != nullptr);
  CHECK(hit->positions == 10);
  std::vector<int32_t> other = p;
  other[15] = 999;  // diverges inside the longer one
  hit = c.lookup(other);
  REQUIRE(hit != nullptr);
  CHECK(hit->positions == 10);
  other[3] = 999;
  CHECK(c.lookup(other) == nullptr);
  CHECK(c.stats().hits == 3);
  CHECK(c.stats().misses == 2);
  CHECK(c.stats().hit_tokens == 20 + 10 + 10);

  // A third entry must evict one. The 20-position snapshot used just now (age 0) is worth 20 / 1,
  // the 10-position one used two lookups ago 10 / 3: the shorter, staler one goes.
  REQUIRE(c.lookup(p) != nullptr);
  const std::vector<int32_t> q = iota_ids(15, 500);
  CHECK(c.insert(q, fake(15, 150)));
  CHECK(c.stats().evictions == 1);
  CHECK(c.size() == 2);
  CHECK(c.bytes() <= c.budget());
  hit = c.lookup(p);
  REQUIRE(hit != nullptr);
  CHECK(hit->positions == 20);
  CHECK(c.lookup(iota_ids(11)) == nullptr);  // the 10-position snapshot is gone
}

namespace {

void restore_is_exact(bool streamed) {
  const io::ModelConfig cfg = pipeline::load_model_config(kTiny, std::nullopt);
  const std::vector<int32_t> whole = prompt_ids(23, 1, cfg.vocab);
  const int gen = 4;
  const std::vector<std::string> want = solo_logits(cfg, whole, gen, streamed);

  BatchEngine e(dec_options(64, streamed), cfg, 2);
  std::vector<float> logits(size_t(cfg.vocab));
  // Slot 0 feeds the whole prompt in passes of 5 ids; a snapshot is taken after each pass but the
  // last (positions 5, 10, 15, 20) and the slot's own at the end.
  e.set_max_step_rows(5);
  std::map<size_t, BatchEngine::Snapshot> snaps;
  e.set_after_partial_pass([&](int seq) {
    CHECK(seq == 0);
    snaps[e.cached(seq)] = e.snapshot(seq);
  });
  const BatchEngine::Row row0{.seq = 0, .ids = whole, .logits = logits};
  e.step(std::span(&row0, 1));
  e.set_after_partial_pass({});
  CHECK(bytes_of(logits) == want[0]);
  REQUIRE(snaps.size() == 4);
  CHECK(snaps.begin()->first == 5);
  CHECK(snaps.rbegin()->first == 20);
  CHECK(snaps.at(10).bytes() == e.snapshot_bytes(10));

  // Slot 1 resumes from each snapshot in turn and feeds the rest: the whole prompt's bytes, and the
  // greedy steps after it.
  for (const auto& [at_, snap] : snaps) {
    const auto& at = at_;  // doctest's lambdas need a variable: clang 14 cannot capture a binding
    CAPTURE(at);
    e.restore(1, snap);
    CHECK(e.cached(1) == at);
    const BatchEngine::Row row1{.seq = 1, .ids = std::span(whole).subspan(at), .logits = logits};
    e.step(std::span(&row1, 1));
    CHECK(bytes_of(logits) == want[0]);
    for (int g = 1; g <= gen; ++g) {
      const int32_t id = int32_t(kernels::argmax(logits));
      const BatchEngine::Row next{.seq = 1, .ids = std::span(&id, 1), .logits = logits};
      e.step(std::span(&next, 1));
      CHECK(bytes_of(logits) == want[size_t(g)]);
    }
  }
}

}  // namespace

TEST_CASE(
    "a slot restored from a snapshot continues with the bytes of the whole prompt fed alone (resident)") {
  restore_is_exact(false);
}

TEST_CASE(
    "a slot restored from a snapshot continues with the bytes of the whole prompt fed alone (streamed)") {
  restore_is_exact(true);
}

namespace {

using namespace k3::pipeline::serve;

struct Collected {
  std::vector<int32_t> ids;
  Outcome outcome;
};

Collected run_one(Scheduler& s, GenRequest r) {
  auto ch = std::make_shared<Channel>();
  REQUIRE(s.submit(std::move(r), ch) == Scheduler::Submit::queued);
  Collected c;
  const auto until = std::chrono::steady_clock::now() + 120s;
  while (!ch->done() && std::chrono::steady_clock::now() < until)
    if (auto d = ch->next(50ms)) c.ids.insert(c.ids.end(), d->ids.begin(), d->ids.end());
  REQUIRE(ch->done());
  c.outcome = *ch->outcome();
  return c;
}

// What `k3flow generate` does: a Decoder and a Sampler, `gen` ids.
std::vector<int32_t> solo_ids(const io::ModelConfig& cfg, const std::vector<int32_t>& prompt,
                              const stages::SamplerOptions& so, int gen) {
  pipeline::Decoder d(dec_options(prompt.size() + size_t(gen) + 1, false), cfg);
  d.push(prompt);
  stages::Sampler s(so);
  std::vector<int32_t> out;
  for (int g = 0; g < gen; ++g) {
    const int32_t id = s.next(d.logits(), d.seq());
    d.push(id);
    out.push_back(id);
  }
  return out;
}

void scheduler_with_cache(bool streamed) {
  const io::ModelConfig cfg = pipeline::load_model_config(kTiny, std::nullopt);
  const io::text::Tokenizer tok = *pipeline::model_tokenizer(kTiny, std::nullopt, cfg, "--prompt");
  SchedulerOptions so{.dec = dec_options(256, streamed), .max_seqs = 2, .queue = 4, .prefill = {}};
  so.prompt_cache_bytes = 64 << 20;
  Scheduler sched(so, cfg, tok);
  REQUIRE(sched.wait_until_settled(60s));
  REQUIRE(sched.phase() == Phase::ready);
  // A pass carries at most 64 ids (capacity 256, 2 sequences: the planner's pass_rows), so a prompt
  // of 90 ids is fed in two passes: snapshots at 64 and at 90; the reply's end adds one at 90 + 5.
  const int gen = 6;
  const std::vector<int32_t> a = prompt_ids(90, 2, cfg.vocab);
  const stages::SamplerOptions seeded{.temperature = 0.9, .top_p = 0.95, .seed = 11};
  auto req = [&](std::vector<int32_t> prompt, const stages::SamplerOptions& sampling) {
    GenRequest r;
    r.prompt = std::move(prompt);
    r.sampling = sampling;
    r.max_tokens = gen;
    r.ignore_eos = true;
    return r;
  };
  const Collected first = run_one(sched, req(a, {}));
  CHECK(first.ids == solo_ids(cfg, a, {}, gen));
  CHECK(first.outcome.cached_tokens == 0);

  // The next turn: the first prompt, its reply, and more. Everything fed before is restored: the
  // prompt and the reply but its last id (sampled, never fed).
  std::vector<int32_t> b = a;
  b.insert(b.end(), first.ids.begin(), first.ids.end());
  const std::vector<int32_t> more = prompt_ids(7, 9, cfg.vocab);
  b.insert(b.end(), more.begin(), more.end());
  const Collected second = run_one(sched, req(b, seeded));
  CHECK(second.ids == solo_ids(cfg, b, seeded, gen));
  CHECK(second.outcome.cached_tokens == int(a.size()) + gen - 1);

  // Sharing only the first 70 ids: the snapshot at the first pass's end (64).
  std::vector<int32_t> c(a.begin(), a.begin() + 70);
  const std::vector<int32_t> tail = prompt_ids(12, 5, cfg.vocab);
  c.insert(c.end(), tail.begin(), tail.end());
  const Collected third = run_one(sched, req(c, {}));
  CHECK(third.ids == solo_ids(cfg, c, {}, gen));
  CHECK(third.outcome.cached_tokens == 64);

  // The first prompt again: its own snapshot (all 90) leaves nothing to feed, so the longest proper
  // prefix held is the pass boundary at 64.
  const Collected again = run_one(sched, req(a, seeded));
  CHECK(again.ids == solo_ids(cfg, a, seeded, gen));
  CHECK(again.outcome.cached_tokens == 64);

  // Inside a prompt a snapshot is taken where the positions doubled since the last: a prompt of 200
  // ids fed in passes of 64 leaves them at 64 and 128 (not at 192) and at its end, so a prompt
  // sharing its first 195 ids resumes at 128.
  const std::vector<int32_t> d = prompt_ids(200, 3, cfg.vocab);
  CHECK(run_one(sched, req(d, {})).outcome.cached_tokens == 0);
  std::vector<int32_t> e(d.begin(), d.begin() + 195);
  e.insert(e.end(), tail.begin(), tail.end());
  const Collected fifth = run_one(sched, req(e, seeded));
  CHECK(fifth.ids == solo_ids(cfg, e, seeded, gen));
  CHECK(fifth.outcome.cached_tokens == 128);

  const Gauges& g = sched.gauges();
  CHECK(g.cache_hits.load() == 4);
  CHECK(g.cache_misses.load() == 2);
  CHECK(g.cache_hit_tokens.load() == uint64_t(a.size() + gen - 1 + 64 + 64 + 128));
  CHECK(g.cache_bytes.load() > 0);
  CHECK(g.cache_bytes.load() <= so.prompt_cache_bytes);
}

}  // namespace

TEST_CASE("serve's scheduler with a prompt cache: a lone run's ids, resuming from the longest held prefix") {
  SUBCASE("resident") {
    scheduler_with_cache(false);
  }
  SUBCASE("streamed") {
    scheduler_with_cache(true);
  }
}

TEST_CASE("serve --prompt-cache-gb: cached_tokens in usage, counters in /metrics; plan holds the budget") {
  using namespace k3::test;
  ServeChild s(kTiny + " --prompt-cache-gb 0.01");
  // More ids than a pass (64). The second prompt adds a word: its ids start with the first prompt's
  // (a new word is its own piece), so it resumes from the snapshot at the first prompt's end.
  std::string text = "the quick brown fox";
  for (int i = 0; i < 30; ++i) text += " the quick brown fox";
  auto ask = [&](const std::string& prompt) {
    const HttpResponse r = http(s.port(), "POST", "/v1/completions",
                                R"({"model":"tiny-k3","prompt":")" + prompt + R"(","max_tokens":3})");
    REQUIRE(r.status == 200);
    simdjson::dom::parser p;
    simdjson::dom::element doc = p.parse(r.body);
    return std::pair{int64_t(doc["usage"]["prompt_tokens"]),
                     int64_t(doc["usage"]["prompt_tokens_details"]["cached_tokens"])};
  };
  const auto [p1, c1] = ask(text);
  CHECK(c1 == 0);
  REQUIRE(p1 > 64);
  const auto [p2, c2] = ask(text + " jumps");
  CHECK(p2 > p1);
  CHECK(c2 == p1);
  const std::string m = http(s.port(), "GET", "/metrics").body;
  CHECK(m.find("\nk3flow_prompt_cache_hits_total 1\n") != std::string::npos);
  CHECK(m.find("\nk3flow_prompt_cache_misses_total 1\n") != std::string::npos);
  CHECK(m.find("\nk3flow_prompt_cache_hit_tokens_total " + std::to_string(c2) + "\n") != std::string::npos);
  CHECK(m.find("\nk3flow_prompt_cache_budget_bytes 10737418\n") != std::string::npos);
  CHECK(s.stop(SIGTERM) == 0);

  const Run plan = k3flow("plan " + kTiny + " --mem-gb 1 --prompt-cache-gb 0.5");
  REQUIRE(plan.code == 0);
  CHECK(plan.out.find("prompt cache: prefix snapshots (--prompt-cache-gb)") != std::string::npos);
  CHECK(plan.out.find("512.00 MiB") != std::string::npos);
  const Run bad = k3flow("serve " + kTiny + " --prompt-cache-gb -1");
  CHECK(bad.code == 2);
  CHECK(bad.err.find("--prompt-cache-gb") != std::string::npos);
}
