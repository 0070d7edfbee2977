// The tiny-model oracle (docs/model.md §6.4-6.5) through the real path: fixtures/tiny-k3 opened as a
// ShardSet, bound by released names, run by stages::forward. Gate 1 teacher forcing, gate 2 greedy
// full recompute, gate 3 incremental; the golden C-engine logits byte for byte; and bit-identity
// of full vs incremental vs chunked prefill vs thread counts on prompts the fixtures never saw.
#include <doctest/doctest.h>
#include <tbb/global_control.h>

#include <cstring>
#include <fstream>
#include <memory>
#include <vector>

#include "io/config.hpp"
#include "io/safetensors.hpp"
#include "kernels/dispatch.hpp"
#include "stages/bind.hpp"
#include "stages/forward.hpp"
#include "stages/head.hpp"
#include "tests/fixture_json.hpp"
#include "tests/isa_bodies.hpp"

using namespace k3;

namespace {

struct Oracle {
  io::ModelConfig cfg = io::load_config(test::fixture_path("tiny-k3/config.json"));
  io::ShardSet shards = io::ShardSet::open(test::fixture_path("tiny-k3"));
  std::unique_ptr<stages::ResidentModel> model = stages::ResidentModel::load(shards, cfg);
  test::Fixture ref{"ref_k3.json"};
  std::vector<int32_t> prompt, full, tf_pred;

  Oracle() {
    for (double v : ref.numbers("prompt_ids")) prompt.push_back(static_cast<int32_t>(v));
    for (double v : ref.numbers("full_ids")) full.push_back(static_cast<int32_t>(v));
    for (double v : ref.numbers("tf_pred")) tf_pred.push_back(static_cast<int32_t>(v));
  }
  size_t V() const { return static_cast<size_t>(cfg.vocab); }
};

Oracle& oracle() {
  static Oracle o;
  return o;
}

// Greedy decode; `chunk` = 0 feeds the prompt in one call, else in pieces of that size. Returns the
// generated ids and appends each step's logits to `logits`.
std::vector<int32_t> decode(bool incremental, const std::vector<int32_t>& prompt, size_t gen,
                            std::vector<float>& logits, size_t chunk = 0) {
  Oracle& o = oracle();
  stages::DecodeState st(o.cfg, o.model->bound_layers(), prompt.size() + gen + 1);
  stages::Scratch sc;
  std::vector<int32_t> seq(prompt), out;
  std::vector<float> lg(o.V());
  for (size_t g = 0; g < gen; ++g) {
    if (!incremental) {
      st.reset();
      stages::forward(*o.model, st, seq, stages::HeadAt::last, lg, sc);
    } else if (g == 0 && chunk > 0) {
      for (size_t at = 0; at < seq.size(); at += chunk) {
        const size_t n = std::min(chunk, seq.size() - at);
        stages::forward(*o.model, st, std::span<const int32_t>(seq).subspan(at, n), stages::HeadAt::last, lg,
                        sc);
      }
    } else {
      stages::forward(*o.model, st, std::span<const int32_t>(seq).subspan(st.cached), stages::HeadAt::last,
                      lg, sc);
    }
    logits.insert(logits.end(), lg.begin(), lg.end());
    out.push_back(stages::greedy(lg));
    seq.push_back(out.back());
  }
  return out;
}

std::vector<int32_t> random_ids(uint32_t seed, size_t n, int vocab) {
  std::vector<int32_t> ids;
  uint32_t s = seed;
  for (size_t i = 0; i < n; ++i) {
    s ^= s << 13;
    s ^= s >> 17;
    s ^= s << 5;
    ids.push_back(static_cast<int32_t>(s % static_cast<uint32_t>(vocab)));
  }
  return ids;
}

bool same_bytes(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace

TEST_CASE("the tiny checkpoint binds by released names through the ShardSet") {
  Oracle& o = oracle();
  CHECK(o.cfg.nested);
  CHECK(o.model->bound_layers() == 13);
  CHECK(o.shards.tensor_count() == 628);
  REQUIRE(o.prompt.size() == 12);
  REQUIRE(o.full.size() == 32);
}

TEST_CASE("gate 1: teacher forcing over full_ids, generated span 20/20; golden logits byte-identical") {
  Oracle& o = oracle();
  const size_t T = o.full.size(), np = o.prompt.size();
  stages::DecodeState st(o.cfg, o.model->bound_layers(), T);
  stages::Scratch sc;
  std::vector<float> logits(T * o.V());
  stages::forward(*o.model, st, o.full, stages::HeadAt::all, logits, sc);
  int all = 0, span = 0;
  for (size_t i = 0; i < T; ++i) {
    const int32_t got = stages::greedy(std::span<const float>(logits).subspan(i * o.V(), o.V()));
    all += got == o.tf_pred[i];
    if (i >= np - 1 && i <= T - 2) span += got == o.tf_pred[i];
  }
  MESSAGE("gate 1: " << all << "/32 positions, generated span " << span << "/20");
  CHECK(span == 20);

  // The C engine's dump of position 31 (fixtures/golden/tiny_c_logits.bin), byte for byte.
  std::ifstream f(test::fixture_path("golden/tiny_c_logits.bin"), std::ios::binary);
  std::vector<float> golden(o.V());
  f.read(reinterpret_cast<char*>(golden.data()), static_cast<std::streamsize>(golden.size() * sizeof(float)));
  REQUIRE(f.gcount() == static_cast<std::streamsize>(o.V() * sizeof(float)));
  CHECK(std::memcmp(golden.data(), logits.data() + (T - 1) * o.V(), o.V() * sizeof(float)) == 0);
  CHECK(stages::greedy(golden) == o.tf_pred[T - 1]);
}

TEST_CASE("gate 2 (greedy, full recompute) and gate 3 (incremental): 20/20 each, identical logits bytes") {
  Oracle& o = oracle();
  const std::vector<int32_t> want(o.full.begin() + 12, o.full.end());
  std::vector<float> lg_full, lg_inc;
  const std::vector<int32_t> g2 = decode(false, o.prompt, 20, lg_full);
  const std::vector<int32_t> g3 = decode(true, o.prompt, 20, lg_inc);
  int ok2 = 0, ok3 = 0;
  for (size_t i = 0; i < 20; ++i) {
    ok2 += g2[i] == want[i];
    ok3 += g3[i] == want[i];
  }
  MESSAGE("gate 2: " << ok2 << "/20, gate 3: " << ok3 << "/20");
  CHECK(ok2 == 20);
  CHECK(ok3 == 20);
  CHECK(same_bytes(lg_full, lg_inc));
}

TEST_CASE("unseen prompts: full == incremental == chunked prefill, and 1 thread == 2 threads, bit for bit") {
  Oracle& o = oracle();
  for (uint32_t seed : {7u, 12345u, 0xC0FFEEu}) {
    const std::vector<int32_t> prompt = random_ids(seed, 1 + seed % 17, o.cfg.vocab);
    CAPTURE(seed);
    std::vector<float> lf, li, lc, l1, l2;
    const auto full = decode(false, prompt, 10, lf);
    const auto inc = decode(true, prompt, 10, li);
    const auto chunked = decode(true, prompt, 10, lc, 3);
    CHECK(full == inc);
    CHECK(full == chunked);
    CHECK(same_bytes(lf, li));
    CHECK(same_bytes(lf, lc));
    {
      tbb::global_control one(tbb::global_control::max_allowed_parallelism, 1);
      CHECK(decode(true, prompt, 10, l1) == inc);
    }
    {
      tbb::global_control two(tbb::global_control::max_allowed_parallelism, 2);
      CHECK(decode(true, prompt, 10, l2) == inc);
    }
    CHECK(same_bytes(l1, li));
    CHECK(same_bytes(l2, li));
  }
}

TEST_CASE("every kernel ISA this CPU has reproduces the golden logits") {
  const k3::test::BodyCheck bodies{kernels::Kernel::matmul, kernels::Kernel::kda_step,
                                   kernels::Kernel::router};
  Oracle& o = oracle();
  std::ifstream f(test::fixture_path("golden/tiny_c_logits.bin"), std::ios::binary);
  std::vector<float> golden(o.V());
  f.read(reinterpret_cast<char*>(golden.data()), static_cast<std::streamsize>(golden.size() * sizeof(float)));
  const kernels::Isa before = kernels::active_isa();
  for (kernels::Isa isa : kernels::supported_isas()) {
    CAPTURE(kernels::isa_name(isa));
    kernels::set_active_isa(isa);
    stages::DecodeState st(o.cfg, o.model->bound_layers(), o.full.size());
    stages::Scratch sc;
    std::vector<float> lg(o.V());
    stages::forward(*o.model, st, o.full, stages::HeadAt::last, lg, sc);
    CHECK(std::memcmp(golden.data(), lg.data(), o.V() * sizeof(float)) == 0);
  }
  kernels::set_active_isa(before);
  bodies.check();
}

TEST_CASE("the KV cache refuses to overflow") {
  Oracle& o = oracle();
  stages::DecodeState st(o.cfg, o.model->bound_layers(), 4);
  stages::Scratch sc;
  std::vector<float> lg(o.V());
  CHECK_THROWS_WITH_AS(stages::forward(*o.model, st, o.prompt, stages::HeadAt::last, lg, sc),
                       doctest::Contains("KV cache overflow"), io::Error);
}
