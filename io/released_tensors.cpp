#include "io/released_tensors.hpp"

#include <fmt/format.h>

#include <charconv>
#include <utility>

namespace k3::io {

namespace {

using F = TensorField;

constexpr const char* kPrefix = "language_model.model.";
constexpr uint64_t kMxfp4Group = 32;  // docs/model.md §4; = quantization_config.group_size

uint64_t u(int v) {
  return static_cast<uint64_t>(v);
}

}  // namespace

std::string layer_prefix(int layer) {
  return fmt::format("{}layers.{}.", kPrefix, layer);
}

std::string expert_prefix(int layer, int expert) {
  return fmt::format("{}block_sparse_moe.experts.{}.", layer_prefix(layer), expert);
}

std::vector<ReleasedTensor> released_layer_trunk(const ModelConfig& c, int layer) {
  std::vector<ReleasedTensor> t;
  const std::string L = layer_prefix(layer);
  auto add = [&](const char* suffix, std::vector<uint64_t> shape, F f, DType d = DType::BF16) {
    t.push_back({L + suffix, std::move(shape), d, f});
  };
  const LayerKind kind = c.layer(layer);
  const uint64_t E = u(c.hidden);
  add("input_layernorm.weight", {E}, F::input_norm);
  add("post_attention_layernorm.weight", {E}, F::post_attn_norm);
  add("self_attention_res_norm.weight", {E}, F::attn_res_norm);
  add("self_attention_res_proj.weight", {1, E}, F::attn_res_proj);
  add("mlp_res_norm.weight", {E}, F::mlp_res_norm);
  add("mlp_res_proj.weight", {1, E}, F::mlp_res_proj);

  if (kind.attention == LayerAttention::kda) {
    const uint64_t H = u(c.kda_heads), D = u(c.kda_head_dim), P = H * D, K = u(c.conv_kernel);
    add("self_attn.q_proj.weight", {P, E}, F::kda_q);
    add("self_attn.k_proj.weight", {P, E}, F::kda_k);
    add("self_attn.v_proj.weight", {P, E}, F::kda_v);
    add("self_attn.g_proj.weight", {P, E}, F::kda_g);
    add("self_attn.o_proj.weight", {E, P}, F::kda_o);
    add("self_attn.q_conv1d.weight", {P, 1, K}, F::kda_q_conv, DType::F32);  // depthwise: [channel][1][tap]
    add("self_attn.k_conv1d.weight", {P, 1, K}, F::kda_k_conv, DType::F32);
    add("self_attn.v_conv1d.weight", {P, 1, K}, F::kda_v_conv, DType::F32);
    add("self_attn.f_a_proj.weight", {D, E}, F::kda_f_a);
    add("self_attn.f_b_proj.weight", {P, D}, F::kda_f_b);
    add("self_attn.b_proj.weight", {H, E}, F::kda_b);
    // Per HEAD, stored with head_dim values: only the first H are used (docs/model.md §2.1).
    add("self_attn.A_log", {D}, F::kda_a_log, DType::F32);
    add("self_attn.dt_bias", {P}, F::kda_dt_bias, DType::F32);
    add("self_attn.o_norm.weight", {D}, F::kda_o_norm, DType::F32);
  } else {
    const uint64_t nh = u(c.mla_heads), qh = u(c.qk_nope + c.qk_rope), kvd = u(c.qk_nope + c.v_head);
    add("self_attn.q_a_proj.weight", {u(c.q_lora_rank), E}, F::mla_q_a);
    add("self_attn.q_a_layernorm.weight", {u(c.q_lora_rank)}, F::mla_q_a_norm);
    add("self_attn.q_b_proj.weight", {nh * qh, u(c.q_lora_rank)}, F::mla_q_b);
    add("self_attn.kv_a_proj_with_mqa.weight", {u(c.kv_lora_rank + c.qk_rope), E}, F::mla_kv_a);
    add("self_attn.kv_a_layernorm.weight", {u(c.kv_lora_rank)}, F::mla_kv_a_norm);
    add("self_attn.kv_b_proj.weight", {nh * kvd, u(c.kv_lora_rank)}, F::mla_kv_b);
    add("self_attn.o_proj.weight", {E, nh * u(c.v_head)}, F::mla_o);
    if (c.mla_out_gate) add("self_attn.g_proj.weight", {nh * u(c.v_head), E}, F::mla_g);
  }

  if (kind.ffn == LayerFfn::dense) {
    const uint64_t I = u(c.dense_inter);
    add("mlp.gate_proj.weight", {I, E}, F::dense_gate);
    add("mlp.up_proj.weight", {I, E}, F::dense_up);
    add("mlp.down_proj.weight", {E, I}, F::dense_down);
  } else {
    const uint64_t N = u(c.n_experts), Lt = u(c.latent), S = u(c.moe_inter * c.n_shared);
    add("block_sparse_moe.gate.weight", {N, E}, F::moe_router);
    // Listed even when latent_norm is off: a checkpoint without it is not the released one.
    add("block_sparse_moe.gate.e_score_correction_bias", {N}, F::moe_bias, DType::F32);
    add("block_sparse_moe.routed_expert_down_proj.weight", {Lt, E}, F::moe_down);
    add("block_sparse_moe.routed_expert_up_proj.weight", {E, Lt}, F::moe_up);
    add("block_sparse_moe.routed_expert_norm.weight", {Lt}, F::moe_norm);
    add("block_sparse_moe.shared_experts.gate_proj.weight", {S, E}, F::shared_gate);
    add("block_sparse_moe.shared_experts.up_proj.weight", {S, E}, F::shared_up);
    add("block_sparse_moe.shared_experts.down_proj.weight", {E, S}, F::shared_down);
  }
  return t;
}

std::vector<ReleasedTensor> released_expert(const ModelConfig& c, int layer, int expert,
                                            ExpertFormat format) {
  const std::string X = expert_prefix(layer, expert);
  const uint64_t I = u(c.moe_inter), Lt = u(c.latent);
  if (format == ExpertFormat::dense) {
    return {
        {X + "w1.weight", {I, Lt}, DType::BF16, F::expert_w1},
        {X + "w2.weight", {Lt, I}, DType::BF16, F::expert_w2},
        {X + "w3.weight", {I, Lt}, DType::BF16, F::expert_w3},
    };
  }
  // MXFP4 (docs/model.md §4): two nibbles per byte, one E8M0 scale per 32 logical elements.
  return {
      {X + "w1.weight_packed", {I, Lt / 2}, DType::U8, F::expert_w1_packed},
      {X + "w1.weight_scale", {I, Lt / kMxfp4Group}, DType::U8, F::expert_w1_scale},
      {X + "w2.weight_packed", {Lt, I / 2}, DType::U8, F::expert_w2_packed},
      {X + "w2.weight_scale", {Lt, I / kMxfp4Group}, DType::U8, F::expert_w2_scale},
      {X + "w3.weight_packed", {I, Lt / 2}, DType::U8, F::expert_w3_packed},
      {X + "w3.weight_scale", {I, Lt / kMxfp4Group}, DType::U8, F::expert_w3_scale},
  };
}

std::string_view model_tensor_name(TensorField f) {
  switch (f) {
    case F::embed:
      return "language_model.model.embed_tokens.weight";
    case F::final_norm:
      return "language_model.model.norm.weight";
    case F::out_res_norm:
      return "language_model.model.output_attn_res_norm.weight";
    case F::out_res_proj:
      return "language_model.model.output_attn_res_proj.weight";
    case F::lm_head:
      return "language_model.lm_head.weight";  // no `.model.`
    default:
      return {};
  }
}

std::vector<ReleasedTensor> released_model_tensors(const ModelConfig& c) {
  const uint64_t E = u(c.hidden), V = u(c.vocab);
  auto t = [](F f, std::vector<uint64_t> shape) {
    return ReleasedTensor{std::string(model_tensor_name(f)), std::move(shape), DType::BF16, f};
  };
  return {t(F::embed, {V, E}), t(F::final_norm, {E}), t(F::out_res_norm, {E}), t(F::out_res_proj, {1, E}),
          t(F::lm_head, {V, E})};
}

NameOwner owner_of(std::string_view name) {
  NameOwner r;
  for (F f : {F::embed, F::final_norm, F::out_res_norm, F::out_res_proj, F::lm_head})
    if (name == model_tensor_name(f)) {
      r.kind = NameOwner::Kind::model;
      r.field = f;
      return r;
    }
  // `<kPrefix>layers.L.` then either `block_sparse_moe.experts.E.` (a routed expert) or the trunk.
  auto take_index = [&name](int& out) {
    auto [p, ec] = std::from_chars(name.data(), name.data() + name.size(), out);
    if (ec != std::errc() || p == name.data() || p == name.data() + name.size() || *p != '.') return false;
    name.remove_prefix(size_t(p - name.data()) + 1);
    return true;
  };
  const std::string layers = std::string(kPrefix) + "layers.";
  if (!name.starts_with(layers)) return r;
  name.remove_prefix(layers.size());
  int layer = -1;
  if (!take_index(layer)) return r;
  constexpr std::string_view kExperts = "block_sparse_moe.experts.";
  if (name.starts_with(kExperts)) {
    name.remove_prefix(kExperts.size());
    int expert = -1;
    if (!take_index(expert)) return r;
    r.kind = NameOwner::Kind::expert;
    r.expert = expert;
  } else {
    r.kind = NameOwner::Kind::layer_trunk;
  }
  r.layer = layer;
  return r;
}

}  // namespace k3::io
