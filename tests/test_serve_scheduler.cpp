// pipeline/serve/scheduler.*: continuous batching over BatchEngine on fixtures/tiny-k3, without
// HTTP. Requests that share steps (joining and leaving at different steps, more requests than
// slots) get exactly the ids a lone Decoder + Sampler run gives for the same prompt and options, and
// their text deltas join to the decoded text; a full queue refuses at once; a cancelled sequence
// frees its slot at the next step. The same ids whatever the prefill policy (inline or separate,
// whole or chunked).
#include <doctest/doctest.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "io/text/text_stream.hpp"
#include "pipeline/run/decoder.hpp"
#include "pipeline/run/model_tokenizer.hpp"
#include "pipeline/serve/scheduler.hpp"
#include "stages/sampler.hpp"

using namespace k3;
using namespace k3::pipeline::serve;
using namespace std::chrono_literals;

namespace {

const std::string kTiny = std::string(K3_FIXTURES) + "/tiny-k3";

pipeline::DecoderOptions dec_options(size_t capacity) {
  pipeline::DecoderOptions o;
  o.model_dir = kTiny;
  o.capacity = capacity;
  o.stream.no_progress = true;
  return o;
}

// What `k3flow generate` does for one prompt: a Decoder and a Sampler, `gen` ids.
std::vector<int32_t> solo(const io::ModelConfig& cfg, const std::vector<int32_t>& prompt,
                          const stages::SamplerOptions& so, int gen) {
  pipeline::DecoderOptions o = dec_options(prompt.size() + size_t(gen) + 1);
  pipeline::Decoder d(o, cfg);
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

struct Collected {
  std::vector<int32_t> ids;
  std::string text;
  Outcome outcome;
};

Collected drain(Channel& ch) {
  Collected c;
  const auto until = std::chrono::steady_clock::now() + 120s;
  while (!ch.done() && std::chrono::steady_clock::now() < until) {
    if (auto d = ch.next(50ms)) {
      c.ids.insert(c.ids.end(), d->ids.begin(), d->ids.end());
      c.text += d->text;
    }
  }
  REQUIRE(ch.done());
  c.outcome = *ch.outcome();
  return c;
}

GenRequest request(std::vector<int32_t> prompt, int max_tokens) {
  GenRequest r;
  r.prompt = std::move(prompt);
  r.max_tokens = max_tokens;
  r.ignore_eos = true;
  return r;
}

struct Fixture {
  io::ModelConfig cfg = pipeline::load_model_config(kTiny, std::nullopt);
  io::text::Tokenizer tok = *pipeline::model_tokenizer(kTiny, std::nullopt, cfg, "--prompt");
};

}  // namespace

namespace {

void concurrent_requests(const pipeline::PrefillPolicy& prefill) {
  Fixture f;
  SchedulerOptions so{.dec = dec_options(128), .max_seqs = 2, .queue = 8, .prefill = prefill};
  Scheduler sched(so, f.cfg, f.tok);
  REQUIRE(sched.wait_until_settled(60s));
  REQUIRE(sched.phase() == Phase::ready);

  struct Case {
    std::string prompt;
    stages::SamplerOptions sampling;
    int max_tokens;
  };
  std::vector<Case> cases = {
      {"Hello", {}, 12},
      {"The quick brown fox", {}, 5},  // leaves early; the third takes its slot mid-run
      {"k3flow serves", {.temperature = 0.8, .top_p = 0.9, .seed = 7}, 9},
      {"a", {.temperature = 1.0, .top_k = 20, .seed = 123}, 7},
  };
  std::vector<std::shared_ptr<Channel>> chans;
  for (const Case& c : cases) {
    GenRequest r;
    r.prompt = f.tok.encode(c.prompt, true);
    r.sampling = c.sampling;
    r.max_tokens = c.max_tokens;
    r.ignore_eos = true;
    chans.push_back(std::make_shared<Channel>());
    REQUIRE(sched.submit(r, chans.back()) == Scheduler::Submit::queued);
  }
  for (size_t i = 0; i < cases.size(); ++i) {
    CAPTURE(cases[i].prompt);
    const Collected got = drain(*chans[i]);
    const std::vector<int32_t> prompt = f.tok.encode(cases[i].prompt, true);
    const std::vector<int32_t> want = solo(f.cfg, prompt, cases[i].sampling, cases[i].max_tokens);
    CHECK(got.ids == want);
    CHECK(got.outcome.finish == Finish::length);
    CHECK(got.outcome.completion_tokens == cases[i].max_tokens);
    CHECK(got.outcome.prompt_tokens == int(prompt.size()));
    io::text::TextStream ts(f.tok, {}, {});
    std::string text;
    for (int32_t id : want) text += ts.push(id).text;
    text += ts.finish();
    CHECK(got.text == text);
  }
  CHECK(sched.gauges().completion_tokens.load() == 12 + 5 + 9 + 7);
  CHECK(sched.gauges().decode_steps.load() >= 12);
}

}  // namespace

TEST_CASE("concurrent requests get the ids and text a lone run gives, greedy and seeded") {
  concurrent_requests({});
}

TEST_CASE("the same ids with the joining prompt in a step of its own, or chunked across steps") {
  using Mode = pipeline::PrefillPolicy::Mode;
  for (const pipeline::PrefillPolicy p : {pipeline::PrefillPolicy{.mode = Mode::separate, .chunk = 0},
                                          pipeline::PrefillPolicy{.mode = Mode::inline_decode, .chunk = 2},
                                          pipeline::PrefillPolicy{.mode = Mode::separate, .chunk = 3}}) {
    CAPTURE(pipeline::prefill_mode_name(p.mode));
    CAPTURE(p.chunk);
    concurrent_requests(p);
  }
}

TEST_CASE("stop strings end a request with finish stop, before the stop text") {
  Fixture f;
  Scheduler sched(SchedulerOptions{.dec = dec_options(64), .max_seqs = 1, .queue = 2, .prefill = {}}, f.cfg,
                  f.tok);
  REQUIRE(sched.wait_until_settled(60s));
  const std::vector<int32_t> prompt = f.tok.encode("Hello", true);
  const std::vector<int32_t> want = solo(f.cfg, prompt, {}, 12);
  // The text of ids 3..4 as the stop string: the run stops there.
  const std::string full = f.tok.decode(want);
  const std::string before = f.tok.decode(std::span(want).first(3));
  const std::string stop = full.substr(before.size(), 2);
  REQUIRE(stop.size() == 2);
  GenRequest r = request(prompt, 12);
  r.stop = {stop};
  auto ch = std::make_shared<Channel>();
  REQUIRE(sched.submit(r, ch) == Scheduler::Submit::queued);
  const Collected got = drain(*ch);
  CHECK(got.outcome.finish == Finish::stop);
  // What generate --stop prints for the same ids (invalid UTF-8 in the noise is decoded the same way).
  io::text::TextStream ts(f.tok, {}, {stop});
  std::string want_text;
  for (int32_t id : want) {
    const auto o = ts.push(id);
    want_text += o.text;
    if (o.stop) break;
  }
  CHECK(got.text == want_text);
  CHECK(got.text.find(stop) == std::string::npos);
  CHECK(got.ids.size() < want.size());
}

TEST_CASE("a full queue refuses at once; a cancelled sequence frees its slot") {
  Fixture f;
  Scheduler sched(SchedulerOptions{.dec = dec_options(4096), .max_seqs = 1, .queue = 1, .prefill = {}}, f.cfg,
                  f.tok);
  REQUIRE(sched.wait_until_settled(60s));
  const GenRequest longr = request(f.tok.encode("Hello", true), 4000);
  auto a = std::make_shared<Channel>(), b = std::make_shared<Channel>(), c = std::make_shared<Channel>();
  REQUIRE(sched.submit(longr, a) == Scheduler::Submit::queued);
  // a holds the only slot once admitted; b waits in the queue; c finds the queue full.
  while (sched.gauges().active.load() == 0) std::this_thread::sleep_for(1ms);
  REQUIRE(sched.submit(longr, b) == Scheduler::Submit::queued);
  CHECK(sched.submit(longr, c) == Scheduler::Submit::queue_full);
  // Cancel a after a few tokens: b is admitted into its slot.
  while (!a->next(1s)) {
  }
  a->cancel();
  const Collected got_a = drain(*a);
  CHECK(got_a.outcome.finish == Finish::cancelled);
  CHECK(got_a.outcome.completion_tokens < 4000);
  while (!b->next(1s)) {
  }  // b generates: it has the slot
  b->cancel();
  CHECK(drain(*b).outcome.finish == Finish::cancelled);
  CHECK(sched.gauges().requests_done.load() == 2);
}

TEST_CASE("stop: requests in flight run on within the bound, then are cancelled") {
  Fixture f;
  Scheduler sched(SchedulerOptions{.dec = dec_options(4096), .max_seqs = 1, .queue = 2, .prefill = {}}, f.cfg,
                  f.tok);
  REQUIRE(sched.wait_until_settled(60s));
  auto a = std::make_shared<Channel>();
  REQUIRE(sched.submit(request(f.tok.encode("Hi", true), 4000), a) == Scheduler::Submit::queued);
  while (!a->next(1s)) {
  }
  sched.stop(200ms);
  CHECK(sched.phase() == Phase::stopped);
  CHECK(a->outcome()->finish == Finish::cancelled);
  CHECK(sched.submit(request({1}, 1), std::make_shared<Channel>()) == Scheduler::Submit::stopping);
}

TEST_CASE("a model directory that cannot load settles as failed with the engine's error") {
  Fixture f;
  pipeline::DecoderOptions o = dec_options(64);
  o.stream.mem_gb = 0.00001;  // below any floor: refused as usage
  Scheduler sched(SchedulerOptions{.dec = o, .max_seqs = 1, .queue = 1, .prefill = {}}, f.cfg, f.tok);
  REQUIRE(sched.wait_until_settled(60s));
  CHECK(sched.phase() == Phase::failed);
  REQUIRE(sched.failure());
  CHECK(sched.failure()->kind() == io::ErrorKind::usage);
  CHECK(sched.submit(request({1}, 1), std::make_shared<Channel>()) == Scheduler::Submit::not_ready);
}
