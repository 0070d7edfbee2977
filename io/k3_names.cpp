#include "io/k3_names.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "io/config.hpp"
#include "io/error.hpp"
#include "io/released_tensors.hpp"

namespace k3::io {

namespace {

constexpr uint64_t kHidden = 7168, kVocab = 163840;
constexpr uint64_t kKdaHeads = 96, kKdaHeadDim = 128, kConv = 4;
constexpr uint64_t kMlaHeads = 96, kQLora = 1536, kKvLora = 512, kQkNope = 128, kQkRope = 64, kVHead = 128;
constexpr uint64_t kLatent = 3584, kMoeInter = 3072, kShared = 2, kDenseInter = 33792;
constexpr uint64_t kMxfp4Group = 32;

// Vision tower (invented, see the header): 27 blocks of width 1152; the MLP width, projector width
// and the two F32 vectors are the values that land shards 95 and 96 on their published sizes.
constexpr uint64_t kVisionWidth = 1152, kVisionBlocks = 27, kVisionMlp = 4144, kProjectorWidth = 3460;
constexpr uint64_t kVisionTemporal = 1732, kVisionRope = 17532;

struct Builder {
  std::vector<TensorEntry> out;
  void add(std::string name, DType dtype, std::vector<uint64_t> shape) {
    out.push_back(TensorEntry{std::move(name), dtype, std::move(shape)});
  }
};

// The real model's config, parsed from the config.json this file writes: the layer and head
// tensors are io/released_tensors.hpp's list for it, each in its released dtype.
const ModelConfig& k3_config() {
  static const ModelConfig c = parse_config(k3_config_json(), "k3_config_json()");
  return c;
}

void add(Builder& b, std::vector<ReleasedTensor> ts) {
  for (ReleasedTensor& t : ts) b.add(std::move(t.name), t.dtype, std::move(t.shape));
}

void add_layer(Builder& b, uint32_t l) {
  const ModelConfig& c = k3_config();
  add(b, released_layer_trunk(c, int(l)));
  if (c.is_dense(int(l))) return;  // first_k_dense_replace = 1
  for (uint32_t e = 0; e < kK3Experts; ++e) add(b, released_expert(c, int(l), int(e), ExpertFormat::mxfp4));
}

void add_head(Builder& b) {
  add(b, released_model_tensors(k3_config()));
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
