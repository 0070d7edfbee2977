// `k3flow serve` over several ranks in one process (pipeline/serve/rank_steps.hpp): rank 0's
// Scheduler and N - 1 followers as threads of a ranks::ThreadGroup, each rank holding only its
// experts. Concurrent requests, joining and leaving at different steps, get the ids the
// single-process scheduler gives (which test_serve_scheduler checks against a lone Decoder), at
// N = 2 and 3, resident and with each rank streaming its slice at its floor, with the joining prompt
// inline or in chunked steps of its own; a follower that cannot load its slice fails rank 0's load
// with its message; the step order's wire form round-trips and a malformed one is refused; `plan
// --ranks N --max-seqs M` plans a serving rank: M sequences' state and a pass of M rows exchanged.
// The same under a real mpirun, over HTTP: test_dist_mpi.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "pipeline/ranks/comm.hpp"
#include "pipeline/ranks/rank_experts.hpp"
#include "pipeline/run/batch_engine.hpp"
#include "pipeline/run/decoder.hpp"
#include "pipeline/run/model_tokenizer.hpp"
#include "pipeline/serve/rank_steps.hpp"
#include "pipeline/serve/scheduler.hpp"
#include "tests/run_helpers.hpp"

using namespace k3;
using namespace k3::pipeline::serve;
using namespace std::chrono_literals;
namespace ranks = k3::pipeline::ranks;

namespace {

const std::string kTiny = std::string(K3_FIXTURES) + "/tiny-k3";

struct Fixture {
  io::ModelConfig cfg = pipeline::load_model_config(kTiny, std::nullopt);
  io::text::Tokenizer tok = *pipeline::model_tokenizer(kTiny, std::nullopt, cfg, "--prompt");
};

pipeline::DecoderOptions dec_options(const std::string& preset) {
  pipeline::DecoderOptions o;
  o.model_dir = kTiny;
  o.capacity = 128;
  o.stream.no_progress = true;
  o.stream.preset = preset;
  return o;
}

struct Case {
  std::string prompt;
  stages::SamplerOptions sampling;
  int max_tokens;
};

// Four requests on two slots: the second leaves early and the third takes its slot mid-run; the
// fourth is submitted once the first has its first id, so it joins a step the others are decoding in.
std::vector<std::vector<int32_t>> serve_cases(Scheduler& sched, const Fixture& f) {
  const std::vector<Case> cases = {
      {"Hello", {}, 12},
      {"The quick brown fox", {}, 4},
      {"k3flow serves", {.temperature = 0.8, .top_p = 0.9, .seed = 7}, 9},
      {"a b c", {.temperature = 1.0, .top_k = 20, .seed = 123}, 6},
  };
  REQUIRE(sched.wait_until_settled(120s));
  REQUIRE(sched.phase() == Phase::ready);
  std::vector<std::shared_ptr<Channel>> chans;
  std::vector<std::vector<int32_t>> ids(cases.size());
  for (size_t i = 0; i < cases.size(); ++i) {
    GenRequest r;
    r.prompt = f.tok.encode(cases[i].prompt, true);
    r.sampling = cases[i].sampling;
    r.max_tokens = cases[i].max_tokens;
    r.ignore_eos = true;
    chans.push_back(std::make_shared<Channel>());
    if (i == 3) {  // after the first request's first id
      const auto until = std::chrono::steady_clock::now() + 120s;
      while (ids[0].empty() && std::chrono::steady_clock::now() < until)
        if (auto d = chans[0]->next(50ms)) ids[0].insert(ids[0].end(), d->ids.begin(), d->ids.end());
      REQUIRE(!ids[0].empty());
    }
    REQUIRE(sched.submit(r, chans.back()) == Scheduler::Submit::queued);
  }
  for (size_t i = 0; i < cases.size(); ++i) {
    const auto until = std::chrono::steady_clock::now() + 120s;
    while (!chans[i]->done() && std::chrono::steady_clock::now() < until)
      if (auto d = chans[i]->next(50ms)) ids[i].insert(ids[i].end(), d->ids.begin(), d->ids.end());
    while (auto d = chans[i]->next(0ms)) ids[i].insert(ids[i].end(), d->ids.begin(), d->ids.end());
    REQUIRE(chans[i]->done());
    CHECK(chans[i]->outcome()->finish == Finish::length);
    CHECK(int(ids[i].size()) == cases[i].max_tokens);
  }
  return ids;
}

// The same requests served by rank 0 of an n-thread group, the other ranks following its steps.
std::vector<std::vector<int32_t>> serve_on_ranks(const Fixture& f, int n, const std::string& preset,
                                                 const pipeline::PrefillPolicy& prefill) {
  ranks::ThreadGroup group(n);
  std::vector<std::vector<int32_t>> ids;
  group.run([&](ranks::Comm& comm) {
    ranks::RankExperts experts(comm);
    pipeline::DecoderOptions o = dec_options(preset);
    o.experts = &experts;
    o.ranks = comm.size();
    if (comm.rank() == 0) {
      Scheduler sched(
          SchedulerOptions{.dec = o, .max_seqs = 2, .queue = 8, .prefill = prefill, .ranks = &comm}, f.cfg,
          f.tok);
      ids = serve_cases(sched, f);
      sched.stop(10s);  // drains, then sends the stop order
      CHECK(sched.phase() == Phase::stopped);
    } else {
      std::unique_ptr<pipeline::BatchEngine> engine;
      ranks::on_every_rank(comm, "could not load its slice",
                           [&] { engine = std::make_unique<pipeline::BatchEngine>(o, f.cfg, 2); });
      follow_steps(comm, *engine);  // returns at the stop order
    }
  });
  return ids;
}

}  // namespace

TEST_CASE("rank 0 serves, the other ranks follow its steps: the single process's ids, N = 2 and 3") {
  Fixture f;
  using Mode = pipeline::PrefillPolicy::Mode;
  struct Setup {
    const char* preset;  // "": resident; "ultra": each rank streams its slice at its floor
    pipeline::PrefillPolicy prefill;
  };
  for (const Setup& s : {Setup{"", {}}, Setup{"ultra", {.mode = Mode::separate, .chunk = 2}}}) {
    CAPTURE(s.preset);
    std::vector<std::vector<int32_t>> want;
    {
      Scheduler one(
          SchedulerOptions{.dec = dec_options(s.preset), .max_seqs = 2, .queue = 8, .prefill = s.prefill},
          f.cfg, f.tok);
      want = serve_cases(one, f);
    }
    for (int n : {2, 3}) {
      CAPTURE(n);
      CHECK(serve_on_ranks(f, n, s.preset, s.prefill) == want);
    }
  }
}

TEST_CASE("a follower that cannot load its slice fails rank 0's load, naming the rank and the path") {
  Fixture f;
  ranks::ThreadGroup group(2);
  std::string failure;
  bool collective = false;
  group.run([&](ranks::Comm& comm) {
    ranks::RankExperts experts(comm);
    pipeline::DecoderOptions o = dec_options("");
    o.experts = &experts;
    o.ranks = 2;
    if (comm.rank() == 0) {
      Scheduler sched(SchedulerOptions{.dec = o, .max_seqs = 1, .queue = 1, .prefill = {}, .ranks = &comm},
                      f.cfg, f.tok);
      REQUIRE(sched.wait_until_settled(60s));
      CHECK(sched.phase() == Phase::failed);
      failure = sched.failure() ? sched.failure()->what() : "";
      collective = sched.failure_collective();
    } else {
      o.model_dir = "/nonexistent/slice-of-rank-1";
      CHECK_THROWS_AS(ranks::on_every_rank(comm, "could not load its slice",
                                           [&] { pipeline::BatchEngine engine(o, f.cfg, 1); }),
                      ranks::CollectiveError);
    }
  });
  CHECK(collective);
  CHECK(failure.find("rank 1 of 2 could not load its slice") == 0);
  CHECK(failure.find("/nonexistent/slice-of-rank-1") != std::string::npos);
}

TEST_CASE("the step order round-trips; a malformed one is refused") {
  const StepOrder o{.stop = false,
                    .resets = {1, 0},
                    .rows = {{.seq = 0, .ids = {5, 6, 7}}, {.seq = 1, .ids = {42}}, {.seq = 3, .ids = {}}}};
  const std::string bytes = encode_step(o);
  CHECK(bytes.size() == sizeof(int32_t) * (3 + 2 + 2 * 3 + 3 + 1));
  const StepOrder back = decode_step(bytes);
  CHECK_FALSE(back.stop);
  CHECK(back.resets == o.resets);
  REQUIRE(back.rows.size() == 3);
  for (size_t i = 0; i < 3; ++i) {
    CHECK(back.rows[i].seq == o.rows[i].seq);
    CHECK(back.rows[i].ids == o.rows[i].ids);
  }
  CHECK(decode_step(encode_step(StepOrder{.stop = true, .resets = {}, .rows = {}})).stop);
  CHECK_THROWS_WITH_AS(decode_step(bytes.substr(0, bytes.size() - 4)), doctest::Contains("ends before"),
                       io::Error);
  CHECK_THROWS_WITH_AS(decode_step(bytes.substr(0, 5)), doctest::Contains("not whole words"), io::Error);
  CHECK_THROWS_WITH_AS(decode_step(bytes + std::string(4, '\0')), doctest::Contains("after its last row"),
                       io::Error);
}

TEST_CASE("plan --ranks N --max-seqs M: a serving rank's plan holds M sequences and exchanges M rows") {
  const std::string& tiny = kTiny;
  const io::ModelConfig cfg = pipeline::load_model_config(tiny, std::nullopt);
  const auto exchange_each = [&](uint64_t rows) {
    return rows * uint64_t(cfg.top_k) * uint64_t(cfg.latent) * 4;
  };
  for (const int seqs : {1, 32}) {
    CAPTURE(seqs);
    const test::Run r = test::k3flow(
        fmt::format("plan {} --ranks 2 --mem-gb 1 --context 16 --max-seqs {} --json", tiny, seqs));
    REQUIRE_MESSAGE(r.code == 0, r.err);
    // the exchange's buffers: a pass of max(--context, --max-seqs) rows
    const uint64_t each = exchange_each(uint64_t(std::max(16, seqs)));
    CHECK(r.out.find(fmt::format("{{\"name\":\"expert exchange: send + receive (1 of 2 ranks)\",\"count\":2,"
                                 "\"each\":{},\"bytes\":{}}}",
                                 each, 2 * each)) != std::string::npos);
    const test::Run t =
        test::k3flow(fmt::format("plan {} --ranks 2 --mem-gb 1 --context 16 --max-seqs {}", tiny, seqs));
    REQUIRE_MESSAGE(t.code == 0, t.err);
    CHECK(t.out.find(seqs == 1 ? "x 1 sequence = " : "x 32 sequences = ") != std::string::npos);
  }
}
