// stages/moe.*: Stable LatentMoE against fixtures/ops/moe.json, and the split stages composing to
// the same bits as moe_forward.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "stages/moe.hpp"
#include "tests/stage_helpers.hpp"

using namespace k3;
using test::Fixture;

namespace {

struct MoeFixture {
  Fixture f{"ops/moe.json"};
  io::ModelConfig c = test::tiny_config();
  std::vector<test::Tensor> keep;  // owns every tensor the views point into
  stages::MoeWeights w;
  std::vector<stages::ExpertWeights> experts;

  const test::Tensor& t(const std::string& key) {
    keep.reserve(64);
    keep.push_back(f.tensor(key));
    return keep.back();
  }

  MoeFixture() {
    c.rms_eps = static_cast<float>(f.number("rms_eps"));
    REQUIRE(f.count("n_experts") == static_cast<size_t>(c.n_experts));
    REQUIRE(f.count("top_k") == static_cast<size_t>(c.top_k));
    REQUIRE(f.count("latent") == static_cast<size_t>(c.latent));
    REQUIRE(f.count("moe_inter") == static_cast<size_t>(c.moe_inter));
    REQUIRE(f.count("n_shared") == static_cast<size_t>(c.n_shared));
    c.routed_scale = static_cast<float>(f.number("routed_scale"));
    c.moe_renormalize = f.boolean("renorm");
    c.latent_norm = f.boolean("latent_norm");
    c.situ_beta = static_cast<float>(f.number("situ_b1"));
    c.situ_linear_beta = static_cast<float>(f.number("situ_b2"));
    w.router = test::f32(t("gate_weight"));
    w.bias = t("e_score_correction_bias").data;
    w.down = test::f32(t("down_weight"));
    w.up = test::f32(t("up_weight"));
    w.norm = t("norm_weight").data;
    w.shared_gate = test::f32(t("shared_w1_weight"));
    w.shared_up = test::f32(t("shared_w3_weight"));
    w.shared_down = test::f32(t("shared_w2_weight"));
    for (int e = 0; e < c.n_experts; ++e) {
      const std::string p = "experts_" + std::to_string(e) + "_";
      experts.push_back(
          {test::f32(t(p + "w1_weight")), test::f32(t(p + "w2_weight")), test::f32(t(p + "w3_weight"))});
    }
  }
};

}  // namespace

TEST_CASE("moe_forward matches moe.json; split stages and per-token calls give identical bits") {
  MoeFixture m;
  const auto& c = m.c;
  const auto tol = test::manifest_tolerance();
  const auto in = m.f.tensor("in"), want = m.f.tensor("out");
  const size_t E = static_cast<size_t>(c.hidden), T = in.numel() / E, k = c.top_k, L = c.latent;
  const stages::ExpertFn expert = [&](int e) -> const stages::ExpertWeights& { return m.experts.at(e); };

  std::vector<float> out(T * E), scratch(stages::moe_scratch(c, T));
  stages::moe_forward(m.w, expert, c, in.data, T, out, scratch);
  const auto cmp = test::compare(out, want.data, tol);
  INFO(cmp.str());
  CHECK(cmp.ok());

  // The graph's decomposition: route, latent, shared, one expert_compute per (token, slot) in any
  // order, combine in top-k order.
  std::vector<int32_t> idx(T * k);
  std::vector<float> weight(T * k), rsc(stages::route_scratch(c)), z(T * L), shared(T * E);
  std::vector<float> ssc(stages::shared_scratch(c, T)), eout(T * k * L), esc(stages::expert_scratch(c, 1));
  stages::route(m.w, c, in.data, T, idx, weight, rsc);
  stages::moe_latent(m.w, in.data, T, z);
  stages::shared_experts(m.w, c, in.data, T, shared, ssc);
  for (size_t r = T * k; r-- > 0;)  // reverse order on purpose: completion order is irrelevant
    stages::expert_compute(m.experts.at(idx[r]), c, std::span<const float>(z).subspan((r / k) * L, L), 1,
                           std::span<float>(eout).subspan(r * L, L), esc);
  std::vector<float> out2(T * E), csc(stages::combine_scratch(c, T));
  stages::moe_combine(m.w, c, weight, eout, shared, T, out2, csc);
  CHECK(out2 == out);

  // One token per call: same bits as the batched prefill.
  std::vector<float> out3(T * E);
  for (size_t t = 0; t < T; ++t)
    stages::moe_forward(m.w, expert, c, std::span<const float>(in.data).subspan(t * E, E), 1,
                        std::span<float>(out3).subspan(t * E, E), scratch);
  CHECK(out3 == out);
}
