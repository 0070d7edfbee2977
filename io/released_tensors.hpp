// The released checkpoint's tensors, by name, as a function of the config (docs/model.md §2.1): one
// decoder layer's trunk, one routed expert, the model-level tensors. The one written list: the
// engine's binder (stages/tensors.*), the real checkpoint's catalogue (io/k3_names.*) and the
// synthetic checkpoints (io/synth/synth_layout.cpp) all derive theirs from it.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "io/config.hpp"
#include "io/safetensors.hpp"

namespace k3::io {

// Which weight a tensor is (the engine binds by it, never by name).
enum class TensorField : uint8_t {
  // every layer
  input_norm,
  post_attn_norm,
  attn_res_norm,
  attn_res_proj,
  mlp_res_norm,
  mlp_res_proj,
  // KDA attention
  kda_q,
  kda_k,
  kda_v,
  kda_g,
  kda_o,
  kda_q_conv,
  kda_k_conv,
  kda_v_conv,
  kda_f_a,
  kda_f_b,
  kda_b,
  kda_a_log,
  kda_dt_bias,
  kda_o_norm,
  // MLA attention
  mla_q_a,
  mla_q_a_norm,
  mla_q_b,
  mla_kv_a,
  mla_kv_a_norm,
  mla_kv_b,
  mla_o,
  mla_g,
  // dense FFN (layers < first_dense)
  dense_gate,
  dense_up,
  dense_down,
  // Stable LatentMoE trunk part
  moe_router,
  moe_bias,
  moe_down,
  moe_up,
  moe_norm,
  shared_gate,
  shared_up,
  shared_down,
  // one routed expert: w1 = gate, w3 = up, w2 = down; MXFP4 form splits each into packed + scale
  expert_w1,
  expert_w2,
  expert_w3,
  expert_w1_packed,
  expert_w1_scale,
  expert_w2_packed,
  expert_w2_scale,
  expert_w3_packed,
  expert_w3_scale,
  // model level
  embed,
  final_norm,
  out_res_norm,
  out_res_proj,
  lm_head,
};

// One released tensor: full name, shape and the dtype the release stores it in (the engine also
// accepts F32 / BF16 / F16 for every non-expert tensor; the synthetic checkpoints write this one).
//   F32:  q/k/v_conv1d, dt_bias, o_norm, A_log, gate.e_score_correction_bias;
//   U8:   the MXFP4 experts' weight_packed / weight_scale;
//   BF16: everything else.
struct ReleasedTensor {
  std::string name;
  std::vector<uint64_t> shape;
  DType dtype;
  TensorField field;
};

// Name prefixes: `language_model.model.layers.L.` and `...layers.L.block_sparse_moe.experts.E.`
// (the head is `language_model.lm_head.weight`, without `.model.`).
std::string layer_prefix(int layer);
std::string expert_prefix(int layer, int expert);

// A layer's trunk (everything of `layers.L.` except the routed experts), in a fixed order: the
// residual norms and projections, the layer's attention (KDA or MLA), its FFN (dense or MoE trunk).
std::vector<ReleasedTensor> released_layer_trunk(const ModelConfig&, int layer);

enum class ExpertFormat : uint8_t {
  mxfp4,  // experts.E.wN.weight_packed + .weight_scale, U8 (the released checkpoint)
  dense,  // experts.E.wN.weight, F32 / BF16 (the tiny oracle)
};

// One routed expert's tensors in canonical order (w1, w2, w3; packed before scale).
std::vector<ReleasedTensor> released_expert(const ModelConfig&, int layer, int expert, ExpertFormat);

// embed_tokens, norm, output_attn_res_norm, output_attn_res_proj, lm_head.
std::vector<ReleasedTensor> released_model_tensors(const ModelConfig&);

// The released name of a model-level tensor (embed .. lm_head); empty for any other field.
std::string_view model_tensor_name(TensorField);

// What a released name belongs to, read from the name alone (no config): a layer's trunk, one
// routed expert of a layer, a model-level tensor (`field` says which), or nothing we know.
struct NameOwner {
  enum class Kind : uint8_t { other, layer_trunk, expert, model };
  Kind kind = Kind::other;
  int layer = -1, expert = -1;
  TensorField field = TensorField::embed;  // Kind::model only
};
NameOwner owner_of(std::string_view name);

}  // namespace k3::io
