// stages/mla.*: gated MLA against fixtures/ops/mla.json (no cache, causal), and the cached path.
#include <doctest/doctest.h>

#include <cmath>
#include <vector>

#include "io/error.hpp"
#include "stages/mla.hpp"
#include "tests/stage_helpers.hpp"

using namespace k3;
using test::Fixture;

TEST_CASE(
    "attention_mla matches mla.json; cached one-token steps and segments of one pass give identical bits") {
  const Fixture f("ops/mla.json");
  const auto tol = test::manifest_tolerance();
  io::ModelConfig c = test::tiny_config();
  REQUIRE(f.count("qk_nope") == static_cast<size_t>(c.qk_nope));
  REQUIRE(f.count("qk_rope") == static_cast<size_t>(c.qk_rope));
  REQUIRE(f.count("kv_lora") == static_cast<size_t>(c.kv_lora_rank));
  REQUIRE(f.count("q_lora") == static_cast<size_t>(c.q_lora_rank));
  REQUIRE(f.count("v_head") == static_cast<size_t>(c.v_head));
  REQUIRE(f.count("n_heads") == static_cast<size_t>(c.mla_heads));
  c.rms_eps = static_cast<float>(f.number("rms_eps"));
  // The fixture's scale is (qk_nope + qk_rope)^-1/2 = 32^-1/2: the rope dims count.
  CHECK(std::abs(f.number("scale") - 1.0 / std::sqrt(32.0)) < 1e-7);

  const auto qa = f.tensor("q_a_proj_weight"), qan = f.tensor("q_a_layernorm_weight");
  const auto qb = f.tensor("q_b_proj_weight"), kva = f.tensor("kv_a_proj_with_mqa_weight");
  const auto kvan = f.tensor("kv_a_layernorm_weight"), kvb = f.tensor("kv_b_proj_weight");
  const auto o = f.tensor("o_proj_weight"), g = f.tensor("g_proj_weight");
  stages::MlaWeights w;
  w.q_a = test::f32(qa);
  w.q_b = test::f32(qb);
  w.kv_a = test::f32(kva);
  w.kv_b = test::f32(kvb);
  w.o = test::f32(o);
  w.g = test::f32(g);
  w.q_a_norm = qan.data;
  w.kv_a_norm = kvan.data;

  const auto in = f.tensor("in"), want = f.tensor("out");
  const size_t E = static_cast<size_t>(c.hidden), T = in.numel() / E;
  const size_t kvpp = stages::mla_kv_floats_per_position(c), rpp = stages::mla_rope_floats_per_position(c);
  std::vector<float> kv(T * kvpp), rope(T * rpp), out(T * E);
  std::vector<float> scratch(stages::attention_mla_scratch(c, T, 0));
  stages::attention_mla(w, c, in.data, T, 0, {kv, rope, T}, out, scratch);
  const auto cmp = test::compare(out, want.data, tol);
  INFO(cmp.str());
  CHECK(cmp.ok());

  // Incremental: prefill 2, then one token at a time through the cache.
  std::vector<float> kv2(T * kvpp), rope2(T * rpp), out2(T * E);
  std::vector<float> sc2(stages::attention_mla_scratch(c, T, T));
  stages::attention_mla(w, c, std::span<const float>(in.data).first(2 * E), 2, 0, {kv2, rope2, T}, out2, sc2);
  for (size_t t = 2; t < T; ++t)
    stages::attention_mla(w, c, std::span<const float>(in.data).subspan(t * E, E), 1, t, {kv2, rope2, T},
                          std::span<float>(out2).subspan(t * E, E), sc2);
  CHECK(out2 == out);
  CHECK(kv2 == kv);
  CHECK(rope2 == rope);

  // Several sequences at different cached lengths (one fresh) in ONE multi-segment pass: each
  // segment's output rows and cache rows are the bytes of feeding it alone.
  {
    struct Seq {
      size_t warm_from, warm, from, rows;
    };
    const Seq seqs[] = {{0, 3, 3, 1}, {0, 0, 4, 2}, {2, 1, 1, 1}, {1, 5, 0, 3}};
    const size_t cap = 12, n = std::size(seqs);
    auto rows_of = [&](size_t from, size_t k) {
      std::vector<float> x;
      for (size_t i = 0; i < k; ++i) {
        const auto r = std::span<const float>(in.data).subspan(((from + i) % T) * E, E);
        x.insert(x.end(), r.begin(), r.end());
      }
      return x;
    };
    std::vector<std::vector<float>> skv(n), srope(n), bkv(n), brope(n), want_out(n);
    std::vector<float> x;
    std::vector<stages::MlaSegment> segs;
    for (size_t i = 0; i < n; ++i) {
      const Seq& q = seqs[i];
      skv[i].assign(cap * kvpp, 0.0f);
      bkv[i].assign(cap * kvpp, 0.0f);
      srope[i].assign(cap * rpp, 0.0f);
      brope[i].assign(cap * rpp, 0.0f);
      if (q.warm > 0) {
        const auto wx = rows_of(q.warm_from, q.warm);
        std::vector<float> wo(q.warm * E), sc(stages::attention_mla_scratch(c, q.warm, 0));
        stages::attention_mla(w, c, wx, q.warm, 0, {skv[i], srope[i], cap}, wo, sc);
        stages::attention_mla(w, c, wx, q.warm, 0, {bkv[i], brope[i], cap}, wo, sc);
      }
      const auto bx = rows_of(q.from, q.rows);
      want_out[i].resize(q.rows * E);
      std::vector<float> sc(stages::attention_mla_scratch(c, q.rows, q.warm));
      stages::attention_mla(w, c, bx, q.rows, q.warm, {skv[i], srope[i], cap}, want_out[i], sc);
      segs.push_back(
          {.cache = {bkv[i], brope[i], cap}, .cached = q.warm, .first_row = x.size() / E, .rows = q.rows});
      x.insert(x.end(), bx.begin(), bx.end());
    }
    const size_t rows = x.size() / E;
    std::vector<float> bout(rows * E), sc(stages::attention_mla_scratch(c, segs));
    CHECK(sc.size() <= stages::attention_mla_scratch(c, rows, cap - rows));  // the planner's bound
    stages::attention_mla(w, c, x, rows, segs, bout, sc);
    for (size_t i = 0; i < n; ++i) {
      CAPTURE(i);
      const auto got = std::span<const float>(bout).subspan(segs[i].first_row * E, segs[i].rows * E);
      CHECK(std::vector<float>(got.begin(), got.end()) == want_out[i]);
      CHECK(bkv[i] == skv[i]);
      CHECK(brope[i] == srope[i]);
    }
    // One segment past its capacity: refused before any cache is written (segment 0 would write
    // its position 4, still zero).
    const std::vector<float> kv_before = bkv[0], rope_before = brope[0];
    std::vector<stages::MlaSegment> over = segs;
    over[0].cached = 4;
    over[3].cached = cap - 1;
    CHECK_THROWS_WITH_AS(stages::attention_mla(w, c, x, rows, over, bout, sc),
                         doctest::Contains("KV cache overflow"), k3::io::Error);
    CHECK(bkv[0] == kv_before);
    CHECK(brope[0] == rope_before);
  }

  // Overflowing the cache is refused, never written past.
  CHECK_THROWS_WITH_AS(stages::attention_mla(w, c, std::span<const float>(in.data).first(E), 1, T,
                                             {kv2, rope2, T}, std::span<float>(out2).first(E), sc2),
                       doctest::Contains("KV cache overflow"), k3::io::Error);
}
