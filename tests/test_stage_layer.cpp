// stages/layer.* (+ attnres.*): a whole decoder layer with attention residuals against
// fixtures/ops/layer_kda.json (layer 1, not a boundary) and layer_mla.json (layer 3, boundary).
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "stages/layer.hpp"
#include "tests/stage_helpers.hpp"

using namespace k3;
using test::Fixture;

namespace {

void check_layer(const char* file) {
  const Fixture f(file);
  const auto tol = test::manifest_tolerance();
  io::ModelConfig c = test::tiny_config();
  c.rms_eps = static_cast<float>(f.number("rms_eps"));
  REQUIRE(f.count("attn_res_block_size") == static_cast<size_t>(c.attn_res_block));
  REQUIRE(f.count("hidden") == static_cast<size_t>(c.hidden));
  const int l = static_cast<int>(f.count("layer_idx"));
  REQUIRE(c.is_mla(l) == f.boolean("is_mla"));

  std::vector<test::Tensor> keep;
  keep.reserve(128);
  auto t = [&](const std::string& key) -> const test::Tensor& {
    keep.push_back(f.tensor(key));
    return keep.back();
  };
  stages::LayerWeights w;
  w.layer = l;
  w.kind = c.layer(l);
  w.input_norm = t("input_layernorm_weight").data;
  w.post_attn_norm = t("post_attention_layernorm_weight").data;
  w.attn_res_norm = t("self_attention_res_norm_weight").data;
  w.attn_res_proj = t("self_attention_res_proj_weight").data;
  w.mlp_res_norm = t("mlp_res_norm_weight").data;
  w.mlp_res_proj = t("mlp_res_proj_weight").data;
  if (c.is_mla(l)) {
    stages::MlaWeights a;
    a.q_a = test::f32(t("self_attn_q_a_proj_weight"));
    a.q_a_norm = t("self_attn_q_a_layernorm_weight").data;
    a.q_b = test::f32(t("self_attn_q_b_proj_weight"));
    a.kv_a = test::f32(t("self_attn_kv_a_proj_with_mqa_weight"));
    a.kv_a_norm = t("self_attn_kv_a_layernorm_weight").data;
    a.kv_b = test::f32(t("self_attn_kv_b_proj_weight"));
    a.o = test::f32(t("self_attn_o_proj_weight"));
    a.g = test::f32(t("self_attn_g_proj_weight"));
    w.attn = a;
  } else {
    stages::KdaWeights a;
    a.q = test::f32(t("self_attn_q_proj_weight"));
    a.k = test::f32(t("self_attn_k_proj_weight"));
    a.v = test::f32(t("self_attn_v_proj_weight"));
    a.g = test::f32(t("self_attn_g_proj_weight"));
    a.o = test::f32(t("self_attn_o_proj_weight"));
    a.f_a = test::f32(t("self_attn_f_a_proj_weight"));
    a.f_b = test::f32(t("self_attn_f_b_proj_weight"));
    a.b = test::f32(t("self_attn_b_proj_weight"));
    a.q_conv = t("self_attn_q_conv1d_weight").data;
    a.k_conv = t("self_attn_k_conv1d_weight").data;
    a.v_conv = t("self_attn_v_conv1d_weight").data;
    a.a_log = t("self_attn_A_log").data;
    a.dt_bias = t("self_attn_dt_bias").data;
    a.o_norm = t("self_attn_o_norm_weight").data;
    w.attn = a;
  }
  stages::MoeWeights m;
  m.router = test::f32(t("mlp_gate_weight"));
  m.bias = t("mlp_e_score_correction_bias").data;
  m.down = test::f32(t("mlp_down_weight"));
  m.up = test::f32(t("mlp_up_weight"));
  m.norm = t("mlp_norm_weight").data;
  m.shared_gate = test::f32(t("mlp_shared_w1_weight"));
  m.shared_up = test::f32(t("mlp_shared_w3_weight"));
  m.shared_down = test::f32(t("mlp_shared_w2_weight"));
  w.ffn = m;
  std::vector<stages::ExpertWeights> experts;
  for (int e = 0; e < c.n_experts; ++e) {
    const std::string p = "mlp_experts_" + std::to_string(e) + "_";
    experts.push_back(
        {test::f32(t(p + "w1_weight")), test::f32(t(p + "w2_weight")), test::f32(t(p + "w3_weight"))});
  }
  const stages::ExpertFn expert = [&](int e) -> const stages::ExpertWeights& { return experts.at(e); };

  const auto in = f.tensor("in"), br_in = f.tensor("block_residual_in"), want = f.tensor("out");
  const auto br_out = f.tensor("block_residual_out");
  const size_t E = c.hidden, T = in.numel() / E, nb = br_in.shape[1], maxb = c.max_blocks();
  REQUIRE(br_in.shape[0] == T);

  // block_residual_in is [T][nb][E]; the stack stores [block][T][E].
  std::vector<float> blocks_mem(maxb * T * E);
  stages::BlockStack B(blocks_mem, maxb, T, E);
  for (size_t b = 0; b < nb; ++b)
    for (size_t tt = 0; tt < T; ++tt)
      std::copy_n(br_in.data.begin() + (tt * nb + b) * E, E, B.mutable_block(b).begin() + tt * E);
  B.set_size(nb);

  std::vector<float> P(in.data), kda(stages::kda_state_floats(c), 0.0f);
  const size_t kvpp = stages::mla_kv_floats_per_position(c), rpp = stages::mla_rope_floats_per_position(c);
  std::vector<float> kv(T * kvpp), rope(T * rpp), scratch(stages::decoder_layer_scratch(c, T, 0));
  stages::LayerState st{stages::kda_state_view(c, kda), {kv, rope, T}, 0};
  stages::decoder_layer(w, expert, c, P, T, B, st, scratch);

  const auto cmp = test::compare(P, want.data, tol);
  INFO(file << " out: " << cmp.str());
  CHECK(cmp.ok());
  // The stack after the layer: a boundary pushes the incoming prefix.
  REQUIRE(B.size() == br_out.shape[1]);
  std::vector<float> got_br(T * B.size() * E);
  for (size_t b = 0; b < B.size(); ++b)
    for (size_t tt = 0; tt < T; ++tt)
      std::copy_n(B.block(b, tt).begin(), E, got_br.begin() + (tt * B.size() + b) * E);
  const auto cmp_br = test::compare(got_br, br_out.data, tol);
  INFO(file << " block_residual_out: " << cmp_br.str());
  CHECK(cmp_br.ok());
}

}  // namespace

TEST_CASE("decoder_layer matches layer_kda.json (KDA, not a boundary)") {
  check_layer("ops/layer_kda.json");
}
TEST_CASE("decoder_layer matches layer_mla.json (MLA, boundary: snapshot then clear)") {
  check_layer("ops/layer_mla.json");
}
