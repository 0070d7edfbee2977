// stages/mla.*: gated MLA against fixtures/ops/mla.json (no cache, causal), and the cached path.
#include <doctest/doctest.h>

#include <cmath>
#include <vector>

#include "io/error.hpp"
#include "stages/mla.hpp"
#include "tests/stage_helpers.hpp"

using namespace k3;
using test::Fixture;

TEST_CASE("attention_mla matches mla.json; cached one-token steps give identical bits") {
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

  // Overflowing the cache is refused, never written past.
  CHECK_THROWS_WITH_AS(stages::attention_mla(w, c, std::span<const float>(in.data).first(E), 1, T,
                                             {kv2, rope2, T}, std::span<float>(out2).first(E), sc2),
                       doctest::Contains("KV cache overflow"), k3::io::Error);
}
