// stages/kda.*: a whole KDA attention block against fixtures/ops/kda_layer{1,8}.json.
#include <doctest/doctest.h>

#include <vector>

#include "stages/kda.hpp"
#include "tests/stage_helpers.hpp"

using namespace k3;
using test::Fixture;

namespace {

void check_kda_layer(const char* file) {
  const Fixture f(file);
  const auto tol = test::manifest_tolerance();
  io::ModelConfig c = test::tiny_config();
  const size_t T = f.count("T"), H = f.count("H"), D = f.count("d_k"), E = static_cast<size_t>(c.hidden);
  REQUIRE(H == static_cast<size_t>(c.kda_heads));
  REQUIRE(D == static_cast<size_t>(c.kda_head_dim));
  REQUIRE(f.count("conv_k") == static_cast<size_t>(c.conv_kernel));
  c.gate_lower_bound = static_cast<float>(f.number("lower_bound"));
  c.rms_eps = static_cast<float>(f.number("rms_eps"));

  const auto q = f.tensor("q_proj"), k = f.tensor("k_proj"), v = f.tensor("v_proj"), g = f.tensor("g_proj");
  const auto o = f.tensor("o_proj"), fa = f.tensor("f_a"), fb = f.tensor("f_b"), b = f.tensor("b_proj");
  const auto qc = f.tensor("q_conv"), kc = f.tensor("k_conv"), vc = f.tensor("v_conv");
  const auto a_log = f.tensor("A_log"), dt = f.tensor("dt_bias"), on = f.tensor("o_norm");
  stages::KdaWeights w{test::f32(q),  test::f32(k),  test::f32(v), test::f32(g), test::f32(o),
                       test::f32(fa), test::f32(fb), test::f32(b), qc.data,      kc.data,
                       vc.data,       a_log.data,    dt.data,      on.data};

  const auto in = f.tensor("in"), want = f.tensor("out"), want_state = f.tensor("state_out");
  REQUIRE(in.numel() == T * E);
  std::vector<float> state(stages::kda_state_floats(c), 0.0f), out(T * E);
  std::vector<float> scratch(stages::attention_kda_scratch(c, T));
  stages::attention_kda(w, c, in.data, T, stages::kda_state_view(c, state), out, scratch);

  auto cmp = test::compare(out, want.data, tol);
  INFO(file << " out: " << cmp.str());
  CHECK(cmp.ok());
  cmp = test::compare(std::span<const float>(state).first(H * D * D), want_state.data, tol);
  INFO(file << " state: " << cmp.str());
  CHECK(cmp.ok());

  // Feeding the same tokens one call at a time (carried state) gives the same bits.
  std::vector<float> state2(state.size(), 0.0f), out2(T * E);
  for (size_t t = 0; t < T; ++t)
    stages::attention_kda(w, c, std::span<const float>(in.data).subspan(t * E, E), 1,
                          stages::kda_state_view(c, state2), std::span<float>(out2).subspan(t * E, E),
                          scratch);
  CHECK(out2 == out);
  CHECK(state2 == state);
}

}  // namespace

TEST_CASE("attention_kda matches kda_layer1.json") {
  check_kda_layer("ops/kda_layer1.json");
}
TEST_CASE("attention_kda matches kda_layer8.json, and token-by-token equals one call") {
  check_kda_layer("ops/kda_layer8.json");
}
