#include "io/k3_names.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "io/error.hpp"

namespace k3::io {

namespace {

constexpr uint64_t kHidden = 7168, kVocab = 163840;
constexpr uint64_t kKdaHeads = 96, kKdaHeadDim = 128, kKdaProj = kKdaHeads * kKdaHeadDim, kConv = 4;
constexpr uint64_t kMlaHeads = 96, kQLora = 1536, kKvLora = 512, kQkNope = 128, kQkRope = 64, kVHead = 128;
constexpr uint64_t kLatent = 3584, kMoeInter = 3072, kShared = 2, kDenseInter = 33792;
constexpr uint64_t kMxfp4Group = 32;

// Vision tower (invented, see the header): 27 blocks of width 1152; the MLP width, projector width
// and the two F32 vectors are the values that land shards 95 and 96 on their published sizes.
constexpr uint64_t kVisionWidth = 1152, kVisionBlocks = 27, kVisionMlp = 4144, kProjectorWidth = 3460;
constexpr uint64_t kVisionTemporal = 1732, kVisionRope = 17532;

const std::string kPrefix = "language_model.model.";

struct Builder {
  std::vector<TensorEntry> out;
  void add(std::string name, DType dtype, std::vector<uint64_t> shape) {
    out.push_back(TensorEntry{std::move(name), dtype, std::move(shape)});
  }
};

void add_layer(Builder& b, uint32_t l) {
  const std::string p = fmt::format("{}layers.{}.", kPrefix, l);
  for (const char* n :
       {"input_layernorm", "post_attention_layernorm", "self_attention_res_norm", "mlp_res_norm"}) {
    b.add(p + n + ".weight", DType::BF16, {kHidden});
  }
  b.add(p + "self_attention_res_proj.weight", DType::BF16, {1, kHidden});
  b.add(p + "mlp_res_proj.weight", DType::BF16, {1, kHidden});

  const std::string a = p + "self_attn.";
  if (k3_layer_is_mla(l)) {
    b.add(a + "q_a_proj.weight", DType::BF16, {kQLora, kHidden});
    b.add(a + "q_a_layernorm.weight", DType::BF16, {kQLora});
    b.add(a + "q_b_proj.weight", DType::BF16, {kMlaHeads * (kQkNope + kQkRope), kQLora});
    b.add(a + "kv_a_proj_with_mqa.weight", DType::BF16, {kKvLora + kQkRope, kHidden});
    b.add(a + "kv_a_layernorm.weight", DType::BF16, {kKvLora});
    b.add(a + "kv_b_proj.weight", DType::BF16, {kMlaHeads * (kQkNope + kVHead), kKvLora});
    b.add(a + "o_proj.weight", DType::BF16, {kHidden, kMlaHeads * kVHead});
    b.add(a + "g_proj.weight", DType::BF16, {kMlaHeads * kVHead, kHidden});
  } else {
    for (const char* n : {"q_proj", "k_proj", "v_proj", "g_proj"}) {
      b.add(a + n + ".weight", DType::BF16, {kKdaProj, kHidden});
    }
    b.add(a + "o_proj.weight", DType::BF16, {kHidden, kKdaProj});
    for (const char* n : {"q_conv1d", "k_conv1d", "v_conv1d"}) {
      b.add(a + n + ".weight", DType::F32, {kKdaProj, 1, kConv});
    }
    b.add(a + "f_a_proj.weight", DType::BF16, {kKdaHeadDim, kHidden});
    b.add(a + "f_b_proj.weight", DType::BF16, {kKdaProj, kKdaHeadDim});
    b.add(a + "b_proj.weight", DType::BF16, {kKdaHeads, kHidden});
    b.add(a + "dt_bias", DType::F32, {kKdaProj});
    b.add(a + "o_norm.weight", DType::F32, {kKdaHeadDim});
    b.add(a + "A_log", DType::F32, {kKdaHeadDim});  // per head, padded to D (docs/model.md §2.1)
  }

  if (l == 0) {  // first_k_dense_replace = 1
    b.add(p + "mlp.gate_proj.weight", DType::BF16, {kDenseInter, kHidden});
    b.add(p + "mlp.up_proj.weight", DType::BF16, {kDenseInter, kHidden});
    b.add(p + "mlp.down_proj.weight", DType::BF16, {kHidden, kDenseInter});
    return;
  }
  const std::string m = p + "block_sparse_moe.";
  b.add(m + "gate.weight", DType::BF16, {kK3Experts, kHidden});
  b.add(m + "gate.e_score_correction_bias", DType::F32, {kK3Experts});
  b.add(m + "routed_expert_down_proj.weight", DType::BF16, {kLatent, kHidden});
  b.add(m + "routed_expert_up_proj.weight", DType::BF16, {kHidden, kLatent});
  b.add(m + "routed_expert_norm.weight", DType::BF16, {kLatent});
  b.add(m + "shared_experts.gate_proj.weight", DType::BF16, {kMoeInter * kShared, kHidden});
  b.add(m + "shared_experts.up_proj.weight", DType::BF16, {kMoeInter * kShared, kHidden});
  b.add(m + "shared_experts.down_proj.weight", DType::BF16, {kHidden, kMoeInter * kShared});
  // MXFP4: two values per packed byte, one E8M0 scale byte per group of 32 (docs/model.md §4).
  for (uint32_t e = 0; e < kK3Experts; ++e) {
    const std::string x = fmt::format("{}experts.{}.", m, e);
    for (const char* w : {"w1", "w2", "w3"}) {
      const bool down = w[1] == '2';
      const uint64_t rows = down ? kLatent : kMoeInter, cols = down ? kMoeInter : kLatent;
      b.add(x + w + ".weight_packed", DType::U8, {rows, cols / 2});
      b.add(x + w + ".weight_scale", DType::U8, {rows, cols / kMxfp4Group});
    }
  }
}

void add_head(Builder& b) {
  b.add(kPrefix + "embed_tokens.weight", DType::BF16, {kVocab, kHidden});
  b.add("language_model.lm_head.weight", DType::BF16, {kVocab, kHidden});
  b.add(kPrefix + "norm.weight", DType::BF16, {kHidden});
  b.add(kPrefix + "output_attn_res_norm.weight", DType::BF16, {kHidden});
  b.add(kPrefix + "output_attn_res_proj.weight", DType::BF16, {1, kHidden});
}

void add_vision_embed(Builder& b) {
  b.add("vision_tower.patch_embed.proj.weight", DType::BF16, {kVisionWidth, 3, 14, 14});
  b.add("vision_tower.patch_embed.pos_emb.weight", DType::BF16, {64, 64, kVisionWidth});
  b.add("vision_tower.patch_embed.pos_emb.temporal_weight", DType::F32, {kVisionTemporal});
  b.add("mm_projector.proj.0.weight", DType::BF16, {kProjectorWidth, 4 * kVisionWidth});
  b.add("mm_projector.proj.2.weight", DType::BF16, {kHidden, kProjectorWidth});
}

void add_vision_encoder(Builder& b) {
  for (uint64_t i = 0; i < kVisionBlocks; ++i) {
    const std::string p = fmt::format("vision_tower.encoder.blocks.{}.", i);
    b.add(p + "norm0.weight", DType::BF16, {kVisionWidth});
    b.add(p + "attn.wqkv.weight", DType::BF16, {3 * kVisionWidth, kVisionWidth});
    b.add(p + "attn.wo.weight", DType::BF16, {kVisionWidth, kVisionWidth});
    b.add(p + "norm1.weight", DType::BF16, {kVisionWidth});
    b.add(p + "mlp.fc0.weight", DType::BF16, {kVisionMlp, kVisionWidth});
    b.add(p + "mlp.fc1.weight", DType::BF16, {kVisionWidth, kVisionMlp});
  }
  b.add("vision_tower.encoder.rope_2d.freqs", DType::F32, {kVisionRope});
}

// docs/engine.md §1.3. Shards 11.. (layers 10..) are larger by the extra digit of every name.
constexpr uint64_t kLayer0Bytes = 2'341'216'112, kHeadBytes = 4'697'664'072;
constexpr uint64_t kKdaBytes = 16'990'911'504, kMlaBytes = 16'567'501'776;
constexpr uint64_t kKdaTwoDigit = 5'408, kMlaTwoDigit = 5'400;
constexpr uint64_t kVisionEmbedBytes = 92'289'328, kVisionEncoderBytes = 802'448'352;

}  // namespace

std::string k3_shard_file_name(uint32_t shard) {
  return fmt::format("model-{:05d}-of-{:06d}.safetensors", shard + 1, kK3Shards);
}

std::vector<TensorEntry> k3_shard_tensors(uint32_t shard) {
  Builder b;
  if (shard < kK3Layers) {
    b.out.reserve(6 + 14 + 8 + 6 * kK3Experts);
    add_layer(b, shard);
  } else if (shard == kK3Layers) {
    add_head(b);
  } else if (shard == kK3Layers + 1) {
    add_vision_embed(b);
  } else if (shard == kK3Layers + 2) {
    add_vision_encoder(b);
  } else {
    throw usage_error(fmt::format("k3_shard_tensors: shard {} out of range 0..{}", shard, kK3Shards - 1));
  }
  std::sort(b.out.begin(), b.out.end(), [](const TensorEntry& x, const TensorEntry& y) {
    const int rx = data_order_rank(x.dtype), ry = data_order_rank(y.dtype);
    return rx != ry ? rx < ry : x.name < y.name;
  });
  return std::move(b.out);
}

uint64_t k3_published_shard_bytes(uint32_t shard) {
  if (shard == 0) return kLayer0Bytes;
  if (shard < kK3Layers) {
    const bool mla = k3_layer_is_mla(shard);
    return (mla ? kMlaBytes : kKdaBytes) + (shard >= 10 ? (mla ? kMlaTwoDigit : kKdaTwoDigit) : 0);
  }
  if (shard == kK3Layers) return kHeadBytes;
  if (shard == kK3Layers + 1) return kVisionEmbedBytes;
  if (shard == kK3Layers + 2) return kVisionEncoderBytes;
  throw usage_error(
      fmt::format("k3_published_shard_bytes: shard {} out of range 0..{}", shard, kK3Shards - 1));
}

std::string k3_config_json() {
  std::string layers;
  for (uint32_t l = 0; l < kK3Layers; ++l) {
    if (k3_layer_is_mla(l)) layers += fmt::format("{}{}", layers.empty() ? "" : ", ", l + 1);
  }
  return fmt::format(R"({{
  "architectures": ["KimiK3ForConditionalGeneration"],
  "model_type": "kimi_k3",
  "text_config": {{
    "hidden_size": {}, "num_hidden_layers": {}, "vocab_size": {}, "rms_norm_eps": 1e-05,
    "tie_word_embeddings": false,
    "num_attention_heads": {}, "q_lora_rank": {}, "kv_lora_rank": {},
    "qk_nope_head_dim": {}, "qk_rope_head_dim": {}, "v_head_dim": {}, "mla_use_output_gate": true,
    "num_experts": {}, "num_experts_per_token": 16, "num_shared_experts": {},
    "routed_expert_hidden_size": {}, "moe_intermediate_size": {}, "routed_scaling_factor": 1.0,
    "moe_renormalize": true, "latent_moe_use_norm": true, "first_k_dense_replace": 1,
    "intermediate_size": {}, "attn_res_block_size": 12,
    "activation_situ_beta": 4.0, "activation_situ_linear_beta": 25.0,
    "quantization_config": {{"format": "mxfp4", "group_size": {}}},
    "linear_attn_config": {{
      "num_heads": {}, "head_dim": {}, "short_conv_kernel_size": {}, "gate_lower_bound": -5.0,
      "full_attn_layers": [{}]
    }}
  }}
}}
)",
                     kHidden, kK3Layers, kVocab, kMlaHeads, kQLora, kKvLora, kQkNope, kQkRope, kVHead,
                     kK3Experts, kShared, kLatent, kMoeInter, kDenseInter, kMxfp4Group, kKdaHeads,
                     kKdaHeadDim, kConv, layers);
}

}  // namespace k3::io
