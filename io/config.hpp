// config.json reader (docs/model.md §1): nested (`text_config`) and flat shapes, every field read, no
// defaults for required fields, the structural refusals of §1.3 in their order.
#pragma once
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

namespace k3::io {

enum class LayerAttention { kda, mla };
enum class LayerFfn { dense, moe };

struct LayerKind {
  LayerAttention attention;
  LayerFfn ffn;
  bool attn_res_boundary;  // l mod attn_res_block_size == 0
};

struct ModelConfig {
  std::string source;   // path (or name) the config was read from, for messages
  bool nested = false;  // true iff `text_config` exists

  int hidden = 0, n_layers = 0, vocab = 0;
  float rms_eps = 0;
  int kda_heads = 0, kda_head_dim = 0, conv_kernel = 0;
  float gate_lower_bound = 0;
  int mla_heads = 0, q_lora_rank = 0, kv_lora_rank = 0, qk_nope = 0, qk_rope = 0, v_head = 0;
  bool mla_out_gate = true;  // optional, default true (the only defaults, docs/model.md §1.2)
  int n_experts = 0, top_k = 0, n_shared = 0, latent = 0, moe_inter = 0;
  float routed_scale = 0;
  bool moe_renormalize = true, latent_norm = true;
  int first_dense = 0, dense_inter = 0, attn_res_block = 0;
  float situ_beta = 0, situ_linear_beta = 0;
  std::vector<int> full_attn_layers;  // ONE-based, as in the file

  // Layer map; `l` is ZERO-based everywhere in the engine.
  bool is_mla(int l) const;  // (l+1) in full_attn_layers
  bool is_dense(int l) const { return l < first_dense; }
  LayerKind layer(int l) const;
  int mla_layer_count() const;  // counts duplicates twice, as the references do
  int kda_layer_count() const { return n_layers - mla_layer_count(); }
  int max_blocks() const { return n_layers / attn_res_block + 2; }
  std::string summary() const;  // the one-line `config: ...` summary of docs/model.md §1.3
};

constexpr int kMaxTopK = 64;

// Parse a config from JSON text. A top-level "config" object (fixture wrapper) is unwrapped.
// Throws k3::io::Error (runtime kind) whose message names `source`.
ModelConfig parse_config(std::string_view json, const std::string& source);
ModelConfig load_config(const std::filesystem::path& path);

}  // namespace k3::io
