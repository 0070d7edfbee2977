// config.json and model.safetensors.index.json of a synthetic checkpoint, spelled as the released
// files are (docs/model.md §1.1–1.2; nested shape, KDA keys and the layer map in linear_attn_config).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "io/synth/synth.hpp"

namespace k3::io::synth {

namespace {

// Floats keep a decimal point ("-5.0", "1e-05") so strict integer-only readers see a float.
std::string number(float v) {
  if (std::isfinite(v) && v == std::trunc(v) && std::fabs(v) < 1e15f) return fmt::format("{:.1f}", v);
  return fmt::format("{}", v);
}

std::string int_list(const std::vector<int>& v, const char* indent) {
  if (v.empty()) return "[]";
  std::string s = "[\n";
  for (size_t i = 0; i < v.size(); ++i)
    s += fmt::format("{}  {}{}\n", indent, v[i], i + 1 < v.size() ? "," : "");
  return s + indent + "]";
}

}  // namespace

std::string config_json(const io::ModelConfig& c) {
  std::vector<int> kda;
  for (int l = 0; l < c.n_layers; ++l)
    if (!c.is_mla(l)) kda.push_back(l + 1);
  const char* b[] = {"false", "true"};
  std::string s;
  s += "{\n";
  s += "  \"architectures\": [\n    \"KimiK3ForConditionalGeneration\"\n  ],\n";
  s += "  \"model_type\": \"kimi_k3\",\n";
  s += "  \"tie_word_embeddings\": false,\n";
  s += "  \"text_config\": {\n";
  s += "    \"model_type\": \"kimi_k3\",\n";
  s += fmt::format("    \"hidden_size\": {},\n", c.hidden);
  s += fmt::format("    \"num_hidden_layers\": {},\n", c.n_layers);
  s += fmt::format("    \"vocab_size\": {},\n", c.vocab);
  s += fmt::format("    \"rms_norm_eps\": {},\n", number(c.rms_eps));
  s += "    \"tie_word_embeddings\": false,\n";
  s += fmt::format("    \"num_attention_heads\": {},\n", c.mla_heads);
  s += fmt::format("    \"q_lora_rank\": {},\n", c.q_lora_rank);
  s += fmt::format("    \"kv_lora_rank\": {},\n", c.kv_lora_rank);
  s += fmt::format("    \"qk_nope_head_dim\": {},\n", c.qk_nope);
  s += fmt::format("    \"qk_rope_head_dim\": {},\n", c.qk_rope);
  s += fmt::format("    \"v_head_dim\": {},\n", c.v_head);
  s += fmt::format("    \"mla_use_output_gate\": {},\n", b[c.mla_out_gate]);
  s += fmt::format("    \"num_experts\": {},\n", c.n_experts);
  s += fmt::format("    \"num_experts_per_token\": {},\n", c.top_k);
  s += fmt::format("    \"num_shared_experts\": {},\n", c.n_shared);
  s += fmt::format("    \"routed_expert_hidden_size\": {},\n", c.latent);
  s += fmt::format("    \"moe_intermediate_size\": {},\n", c.moe_inter);
  s += fmt::format("    \"routed_scaling_factor\": {},\n", number(c.routed_scale));
  s += fmt::format("    \"moe_renormalize\": {},\n", b[c.moe_renormalize]);
  s += fmt::format("    \"latent_moe_use_norm\": {},\n", b[c.latent_norm]);
  s += fmt::format("    \"first_k_dense_replace\": {},\n", c.first_dense);
  s += fmt::format("    \"intermediate_size\": {},\n", c.dense_inter);
  s += fmt::format("    \"attn_res_block_size\": {},\n", c.attn_res_block);
  s += fmt::format("    \"activation_situ_beta\": {},\n", number(c.situ_beta));
  s += fmt::format("    \"activation_situ_linear_beta\": {},\n", number(c.situ_linear_beta));
  s += "    \"linear_attn_config\": {\n";
  s += fmt::format("      \"num_heads\": {},\n", c.kda_heads);
  s += fmt::format("      \"head_dim\": {},\n", c.kda_head_dim);
  s += fmt::format("      \"short_conv_kernel_size\": {},\n", c.conv_kernel);
  s += fmt::format("      \"gate_lower_bound\": {},\n", number(c.gate_lower_bound));
  s += "      \"use_full_rank_gate\": false,\n";
  s += fmt::format("      \"full_attn_layers\": {},\n", int_list(c.full_attn_layers, "      "));
  s += fmt::format("      \"kda_layers\": {}\n", int_list(kda, "      "));
  s += "    }\n";
  s += "  },\n";
  s += "  \"quantization_config\": {\n    \"format\": \"mxfp4\",\n    \"group_size\": 32\n  }\n";
  s += "}\n";
  return s;
}

std::string index_json(const SynthCheckpoint& plan) {
  std::vector<std::pair<std::string_view, std::string_view>> map;
  map.reserve(plan.tensor_count());
  for (const SynthShard& s : plan.shards)
    for (const SynthTensor& t : s.tensors) map.emplace_back(t.entry.name, s.file);
  std::sort(map.begin(), map.end());
  std::string out;
  out.reserve(map.size() * 100 + 128);
  out += fmt::format("{{\n  \"metadata\": {{\n    \"total_size\": {}\n  }},\n  \"weight_map\": {{\n",
                     plan.data_bytes());
  for (size_t i = 0; i < map.size(); ++i) {
    out += "    ";
    out += io::json_quote(map[i].first);
    out += ": ";
    out += io::json_quote(map[i].second);
    out += i + 1 < map.size() ? ",\n" : "\n";
  }
  out += "  }\n}\n";
  return out;
}

}  // namespace k3::io::synth
