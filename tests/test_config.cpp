// config.json reader: the fixtures of docs/model.md §1.3, both shapes, the parsing rules of §1.2 and the
// stricter size checks k3flow adds.
#include <doctest/doctest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "io/config.hpp"
#include "io/error.hpp"

using k3::io::Error;
using k3::io::load_config;
using k3::io::ModelConfig;
using k3::io::parse_config;

namespace {

const std::string kFixtures = K3_FIXTURES;

// The tiny flat config, key order as in the fixtures; values are JSON literals.
const std::vector<std::pair<std::string, std::string>> kTiny = {
    {"hidden_size", "128"},
    {"num_hidden_layers", "13"},
    {"vocab_size", "256"},
    {"rms_norm_eps", "1e-05"},
    {"kda_num_heads", "4"},
    {"kda_head_dim", "16"},
    {"short_conv_kernel_size", "4"},
    {"gate_lower_bound", "-5.0"},
    {"num_attention_heads", "4"},
    {"q_lora_rank", "64"},
    {"kv_lora_rank", "32"},
    {"qk_nope_head_dim", "24"},
    {"qk_rope_head_dim", "8"},
    {"v_head_dim", "16"},
    {"mla_use_output_gate", "true"},
    {"num_experts", "8"},
    {"num_experts_per_token", "2"},
    {"num_shared_experts", "2"},
    {"routed_expert_hidden_size", "64"},
    {"moe_intermediate_size", "48"},
    {"routed_scaling_factor", "1.0"},
    {"moe_renormalize", "true"},
    {"latent_moe_use_norm", "true"},
    {"first_k_dense_replace", "1"},
    {"intermediate_size", "96"},
    {"attn_res_block_size", "3"},
    {"situ_beta", "4.0"},
    {"situ_linear_beta", "25.0"},
    {"full_attn_layers", "[4, 8, 12, 13]"},
};

// kTiny with some keys replaced (value) or dropped (empty value).
std::string flat(const std::map<std::string, std::string>& changes = {}) {
  std::string s = "{";
  for (const auto& [k, v] : kTiny) {
    std::string value = v;
    if (auto it = changes.find(k); it != changes.end()) {
      if (it->second.empty()) continue;
      value = it->second;
    }
    if (s.size() > 1) s += ",\n";
    s += "\"" + k + "\": " + value;
  }
  for (const auto& [k, v] : changes) {
    bool known = false;
    for (const auto& kv : kTiny) known = known || kv.first == k;
    if (!known && !v.empty()) s += ",\n\"" + k + "\": " + v;
  }
  return s + "}";
}

std::string refusal(const std::string& json, const std::string& source = "test.json") {
  try {
    parse_config(json, source);
  } catch (const Error& e) {
    CHECK(e.kind() == k3::io::ErrorKind::runtime);
    const std::string m = e.what();
    CHECK(m.find('\n') == std::string::npos);
    return m;
  }
  FAIL("config was accepted: " << json);
  return {};
}

std::string load_refusal(const std::string& path) {
  try {
    load_config(path);
  } catch (const Error& e) {
    return e.what();
  }
  FAIL("config was accepted: " << path);
  return {};
}

bool has(const std::string& m, const std::string& part) {
  return m.find(part) != std::string::npos;
}

// The released nested shape, real values (docs/model.md §1.2), with keys the reader must ignore.
std::string real_nested() {
  std::string layers;
  for (int l = 4; l <= 92; l += 4) layers += std::to_string(l) + ", ";
  layers += "93";
  return R"({
  "architectures": ["KimiK3ForConditionalGeneration"],
  "model_type": "kimi_k3",
  "vision_config": {"hidden_size": 1536, "num_hidden_layers": 13},
  "text_config": {
    "hidden_size": 7168, "num_hidden_layers": 93, "vocab_size": 163840, "rms_norm_eps": 1e-05,
    "tie_word_embeddings": false,
    "num_attention_heads": 96, "q_lora_rank": 1536, "kv_lora_rank": 512,
    "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128, "mla_use_output_gate": true,
    "num_experts": 896, "num_experts_per_token": 16, "num_shared_experts": 2,
    "routed_expert_hidden_size": 3584, "moe_intermediate_size": 3072, "routed_scaling_factor": 1.0,
    "moe_renormalize": true, "latent_moe_use_norm": true, "first_k_dense_replace": 1,
    "intermediate_size": 33792, "attn_res_block_size": 12,
    "activation_situ_beta": 4.0, "activation_situ_linear_beta": 25.0,
    "quantization_config": {"group_size": 32, "format": "mxfp4"},
    "linear_attn_config": {
      "num_heads": 96, "head_dim": 128, "short_conv_kernel_size": 4, "gate_lower_bound": -5.0,
      "use_full_rank_gate": false, "kda_layers": [1, 2, 3],
      "full_attn_layers": [)" +
         layers + R"(]
    }
  }
})";
}

}  // namespace

TEST_CASE("fixture cfg/no_layermap.json is refused as missing full_attn_layers") {
  const std::string m = load_refusal(kFixtures + "/cfg/no_layermap.json");
  CHECK(has(m, "missing 1 required field(s)"));
  CHECK(has(m, "full_attn_layers"));
  CHECK(has(m, "refusing to substitute defaults"));
  CHECK(has(m, "no_layermap.json"));
}

TEST_CASE("fixture cfg/bad_layer_index.json is refused by the one-based range check") {
  const std::string m = load_refusal(kFixtures + "/cfg/bad_layer_index.json");
  CHECK(has(m, "full_attn_layers[2] = 999 is outside 1..13"));
  CHECK(has(m, "ONE-based"));
  CHECK_FALSE(has(m, "missing"));
  CHECK(has(m, "bad_layer_index.json"));
}

TEST_CASE("fixture cfg/bad_topk.json is refused by MAX_TOPK before topk > n_experts") {
  const std::string m = load_refusal(kFixtures + "/cfg/bad_topk.json");
  CHECK(has(m, "selects top-128"));
  CHECK(has(m, "at most 64"));
  CHECK_FALSE(has(m, "missing"));
  CHECK_FALSE(has(m, "of 8 experts"));
}

TEST_CASE("ref_k3.json (wrapped in \"config\") is accepted with the tiny values") {
  const ModelConfig c = load_config(kFixtures + "/ref_k3.json");
  CHECK_FALSE(c.nested);
  CHECK(c.hidden == 128);
  CHECK(c.n_layers == 13);
  CHECK(c.vocab == 256);
  CHECK(c.rms_eps == 1e-5f);
  CHECK(c.kda_heads == 4);
  CHECK(c.kda_head_dim == 16);
  CHECK(c.conv_kernel == 4);
  CHECK(c.gate_lower_bound == -5.0f);
  CHECK(c.mla_heads == 4);
  CHECK(c.q_lora_rank == 64);
  CHECK(c.kv_lora_rank == 32);
  CHECK(c.qk_nope == 24);
  CHECK(c.qk_rope == 8);
  CHECK(c.v_head == 16);
  CHECK(c.mla_out_gate);
  CHECK(c.n_experts == 8);
  CHECK(c.top_k == 2);
  CHECK(c.n_shared == 2);
  CHECK(c.latent == 64);
  CHECK(c.moe_inter == 48);
  CHECK(c.routed_scale == 1.0f);
  CHECK(c.moe_renormalize);
  CHECK(c.latent_norm);
  CHECK(c.first_dense == 1);
  CHECK(c.dense_inter == 96);
  CHECK(c.attn_res_block == 3);
  CHECK(c.situ_beta == 4.0f);
  CHECK(c.situ_linear_beta == 25.0f);
  CHECK(c.full_attn_layers == std::vector<int>{4, 8, 12, 13});
  CHECK(c.mla_layer_count() == 4);
  CHECK(c.kda_layer_count() == 9);
  CHECK(c.is_mla(3));
  CHECK(c.is_mla(12));
  CHECK_FALSE(c.is_mla(0));
  CHECK_FALSE(c.is_mla(4));
  CHECK(c.layer(0).attention == k3::io::LayerAttention::kda);
  CHECK(c.layer(0).ffn == k3::io::LayerFfn::dense);
  CHECK(c.layer(1).ffn == k3::io::LayerFfn::moe);
  CHECK(c.layer(11).attention == k3::io::LayerAttention::mla);
  int boundaries = 0;
  for (int l = 0; l < c.n_layers; ++l) boundaries += c.layer(l).attn_res_boundary;
  CHECK(boundaries == 5);
  CHECK(c.max_blocks() == 6);
  std::string map;
  for (int l = 0; l < c.n_layers; ++l) map += c.is_mla(l) ? 'M' : 'K';
  CHECK(map == "KKKMKKKMKKKMM");
  CHECK(c.summary() == "config: " + kFixtures +
                           "/ref_k3.json (flat shape) | hidden=128 layers=13 vocab=256 | 4 MLA + 9 KDA | "
                           "experts 8 top2 shared2 | latent=64");
}

TEST_CASE("tiny_k3.json and ops/MANIFEST.json configs are accepted") {
  CHECK(load_config(kFixtures + "/tiny_k3.json").n_layers == 13);
  CHECK(load_config(kFixtures + "/ops/MANIFEST.json").top_k == 2);
}

TEST_CASE("nested shape with real values is accepted and reads linear_attn_config") {
  const ModelConfig c = parse_config(real_nested(), "real/config.json");
  CHECK(c.nested);
  CHECK(c.hidden == 7168);
  CHECK(c.n_layers == 93);
  CHECK(c.vocab == 163840);
  CHECK(c.kda_heads == 96);
  CHECK(c.kda_head_dim == 128);
  CHECK(c.conv_kernel == 4);
  CHECK(c.gate_lower_bound == -5.0f);
  CHECK(c.mla_heads == 96);
  CHECK(c.q_lora_rank == 1536);
  CHECK(c.kv_lora_rank == 512);
  CHECK(c.qk_nope == 128);
  CHECK(c.qk_rope == 64);
  CHECK(c.v_head == 128);
  CHECK(c.n_experts == 896);
  CHECK(c.top_k == 16);
  CHECK(c.n_shared == 2);
  CHECK(c.latent == 3584);
  CHECK(c.moe_inter == 3072);
  CHECK(c.dense_inter == 33792);
  CHECK(c.attn_res_block == 12);
  CHECK(c.situ_beta == 4.0f);
  CHECK(c.situ_linear_beta == 25.0f);
  CHECK(c.mla_layer_count() == 24);
  CHECK(c.kda_layer_count() == 69);
  for (int l = 0; l < 93; ++l) CHECK(c.is_mla(l) == (l % 4 == 3 || l == 92));
  CHECK(c.is_mla(91));
  CHECK(c.is_mla(92));
  int boundaries = 0;
  for (int l = 0; l < c.n_layers; ++l) boundaries += c.layer(l).attn_res_boundary;
  CHECK(boundaries == 8);
  CHECK(c.max_blocks() == 9);
  CHECK(c.summary() ==
        "config: real/config.json (nested shape) | hidden=7168 layers=93 vocab=163840 | 24 MLA + 69 KDA | "
        "experts 896 top16 shared2 | latent=3584");
}

TEST_CASE("lookup order: text_config, then linear_attn_config, then root; primary before alias") {
  // A num_heads at the root must not win over linear_attn_config's.
  std::string j = flat({{"kda_num_heads", ""},
                        {"kda_head_dim", ""},
                        {"linear_attn_config", R"({"num_heads": 4, "head_dim": 16})"},
                        {"num_heads", "99"}});
  ModelConfig c = parse_config(j, "x");
  CHECK(c.kda_heads == 4);
  CHECK(c.kda_head_dim == 16);
  CHECK_FALSE(c.nested);
  // Primary name beats the alias in the same object.
  c = parse_config(flat({{"situ_beta", "4.0"}, {"activation_situ_beta", "3.0"}}), "x");
  CHECK(c.situ_beta == 3.0f);
  // text_config wins over the root.
  c = parse_config(R"({"hidden_size": 1, "text_config": )" + flat() + "}", "x");
  CHECK(c.nested);
  CHECK(c.hidden == 128);
}

TEST_CASE("every missing required field is named in one report") {
  const std::string m = refusal("{}");
  CHECK(has(m, "is missing 26 required field(s)"));
  for (const char* k : {"hidden_size",
                        "num_hidden_layers",
                        "vocab_size",
                        "rms_norm_eps",
                        "num_heads",
                        "head_dim",
                        "short_conv_kernel_size",
                        "gate_lower_bound",
                        "num_attention_heads",
                        "q_lora_rank",
                        "kv_lora_rank",
                        "qk_nope_head_dim",
                        "qk_rope_head_dim",
                        "v_head_dim",
                        "num_experts",
                        "num_experts_per_token",
                        "num_shared_experts",
                        "routed_expert_hidden_size",
                        "moe_intermediate_size",
                        "routed_scaling_factor",
                        "first_k_dense_replace",
                        "intermediate_size",
                        "attn_res_block_size",
                        "activation_situ_beta",
                        "activation_situ_linear_beta",
                        "full_attn_layers"}) {
    CHECK_MESSAGE(has(m, k), k);
  }
  CHECK_FALSE(has(m, "mla_use_output_gate"));
  CHECK(has(m, "refusing to substitute defaults"));
  CHECK(has(m, "test.json"));
}

TEST_CASE("ints must be JSON integer literals; a fraction or exponent counts as missing") {
  std::string m = refusal(flat({{"kda_num_heads", "4.0"}}));
  CHECK(has(m, "missing 1 required field(s)"));
  CHECK(has(m, "num_heads"));
  m = refusal(flat({{"hidden_size", "1.28e2"}, {"vocab_size", "\"256\""}}));
  CHECK(has(m, "missing 2 required field(s)"));
  CHECK(has(m, "hidden_size"));
  CHECK(has(m, "vocab_size"));
  // Floats take integer literals too.
  CHECK(parse_config(flat({{"situ_beta", "4"}}), "x").situ_beta == 4.0f);
  m = refusal(flat({{"hidden_size", "4294967296"}}));
  CHECK(has(m, "hidden_size"));
  CHECK(has(m, "32-bit"));
}

TEST_CASE("optional bools default to true; integer literals count, other types keep the default") {
  ModelConfig c = parse_config(flat({{"mla_use_output_gate", ""}, {"moe_renormalize", ""}}), "x");
  CHECK(c.mla_out_gate);
  CHECK(c.moe_renormalize);
  c = parse_config(
      flat({{"mla_use_output_gate", "false"}, {"moe_renormalize", "0"}, {"latent_moe_use_norm", "2"}}), "x");
  CHECK_FALSE(c.mla_out_gate);
  CHECK_FALSE(c.moe_renormalize);
  CHECK(c.latent_norm);
  c = parse_config(flat({{"mla_use_output_gate", "\"false\""}}), "x");
  CHECK(c.mla_out_gate);
}

TEST_CASE("full_attn_layers entries must be numbers; the error ends the load before the missing report") {
  std::string m = refusal(flat({{"full_attn_layers", R"([4, "8", 12])"}, {"hidden_size", ""}}));
  CHECK(has(m, "full_attn_layers[1] is not a number"));
  CHECK_FALSE(has(m, "missing"));
  m = refusal(flat({{"full_attn_layers", "[4, 8.0]"}}));
  CHECK(has(m, "full_attn_layers[1] is not a number"));
  CHECK(has(refusal(flat({{"full_attn_layers", "[]"}})), "missing 1 required field(s): full_attn_layers"));
  CHECK(has(refusal(flat({{"full_attn_layers", "4"}})), "missing 1 required field(s): full_attn_layers"));
}

TEST_CASE("structural refusals, in order") {
  CHECK(has(refusal(flat({{"num_hidden_layers", "0"}})), "has non-positive layers/hidden/vocab"));
  CHECK(has(refusal(flat({{"hidden_size", "-1"}})), "has non-positive layers/hidden/vocab"));
  CHECK(has(refusal(flat({{"vocab_size", "0"}})), "has non-positive layers/hidden/vocab"));
  CHECK(has(refusal(flat({{"num_hidden_layers", "4"}})),
            "marks 4 of 4 layers as full attention, leaving no KDA layers"));
  CHECK(has(refusal(flat({{"full_attn_layers", "[0, 4]"}})), "full_attn_layers[0] = 0 is outside 1..13"));
  CHECK(has(refusal(flat({{"full_attn_layers", "[4, 14]"}})), "full_attn_layers[1] = 14 is outside 1..13"));
  CHECK(has(refusal(flat({{"full_attn_layers", "[4, 18446744073709551615]"}})), "full_attn_layers[1]"));
  // Range check precedes MAX_TOPK.
  CHECK(
      has(refusal(flat({{"full_attn_layers", "[99]"}, {"num_experts_per_token", "128"}})), "outside 1..13"));
  CHECK(has(refusal(flat({{"num_experts_per_token", "65"}, {"num_experts", "100"}})), "selects top-65"));
  CHECK(has(refusal(flat({{"num_experts_per_token", "9"}})), "selects 9 of 8 experts"));
  CHECK(has(refusal(flat({{"attn_res_block_size", "0"}})), "attn_res_block_size = 0 must be positive"));
  CHECK(
      has(refusal(flat({{"short_conv_kernel_size", "0"}})), "short_conv_kernel_size = 0 must be at least 1"));
  // 64 is allowed.
  CHECK(parse_config(flat({{"num_experts_per_token", "64"}, {"num_experts", "64"}}), "x").top_k == 64);
}

TEST_CASE("stricter than the references: non-positive sizes that would crash later are refused") {
  CHECK(has(refusal(flat({{"num_experts_per_token", "0"}})), "num_experts_per_token = 0 must be at least 1"));
  CHECK(has(refusal(flat({{"kda_head_dim", "0"}})), "head_dim = 0 must be at least 1"));
  CHECK(has(refusal(flat({{"kda_num_heads", "-4"}})), "num_heads = -4 must be at least 1"));
  CHECK(has(refusal(flat({{"num_attention_heads", "0"}})), "num_attention_heads = 0"));
  CHECK(has(refusal(flat({{"q_lora_rank", "0"}})), "q_lora_rank = 0"));
  CHECK(has(refusal(flat({{"kv_lora_rank", "0"}})), "kv_lora_rank = 0"));
  CHECK(has(refusal(flat({{"qk_nope_head_dim", "0"}})), "qk_nope_head_dim = 0"));
  CHECK(has(refusal(flat({{"qk_rope_head_dim", "-1"}})), "qk_rope_head_dim = -1"));
  CHECK(has(refusal(flat({{"v_head_dim", "0"}})), "v_head_dim = 0"));
  CHECK(has(refusal(flat({{"routed_expert_hidden_size", "0"}})), "routed_expert_hidden_size = 0"));
  CHECK(has(refusal(flat({{"moe_intermediate_size", "0"}})), "moe_intermediate_size = 0"));
  CHECK(has(refusal(flat({{"num_shared_experts", "-1"}})), "num_shared_experts = -1"));
  CHECK(has(refusal(flat({{"first_k_dense_replace", "-1"}})), "first_k_dense_replace = -1"));
  CHECK(has(refusal(flat({{"first_k_dense_replace", "14"}})), "exceeds num_hidden_layers"));
  CHECK(has(refusal(flat({{"intermediate_size", "0"}})), "intermediate_size = 0"));
  // No dense layers: intermediate_size is still required but may be anything.
  CHECK(parse_config(flat({{"first_k_dense_replace", "0"}, {"intermediate_size", "0"}}), "x").first_dense ==
        0);
  // qk_rope 0 (pure NoPE) and no shared experts are structurally fine.
  CHECK(parse_config(flat({{"qk_rope_head_dim", "0"}, {"num_shared_experts", "0"}}), "x").qk_rope == 0);
}

TEST_CASE("duplicates in full_attn_layers are counted twice, as the references do") {
  const ModelConfig c = parse_config(flat({{"full_attn_layers", "[4, 4, 8]"}}), "x");
  CHECK(c.mla_layer_count() == 3);
  CHECK(c.kda_layer_count() == 10);
}

TEST_CASE("malformed input is refused with the path, never crashes") {
  CHECK(has(refusal("{\"hidden_size\": ", "broken.json"), "broken.json"));
  CHECK(has(refusal("[1, 2]"), "not a JSON object"));
  CHECK(has(refusal("{\"text_config\": 3}"), "text_config"));
  CHECK(has(refusal(std::string("{\"a\": \"\xff\"}")), "not valid JSON"));
  CHECK(has(load_refusal("/nonexistent/k3/config.json"), "/nonexistent/k3/config.json"));
}

TEST_CASE("load_config accepts a model directory") {
  const auto dir = std::filesystem::temp_directory_path() / ("k3cfg_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "config.json") << real_nested();
  const ModelConfig c = load_config(dir);
  CHECK(c.source == (dir / "config.json").string());
  CHECK(c.n_layers == 93);
  std::filesystem::remove_all(dir);
}

TEST_CASE("a config.json that is a directory is named as one, not searched inside") {
  const auto dir = std::filesystem::temp_directory_path() / ("k3cfgdir_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir / "config.json");
  const std::string want = (dir / "config.json").string() + " is a directory";
  std::string m = load_refusal((dir / "config.json").string());
  CHECK_MESSAGE(has(m, want), m);
  CHECK_FALSE(has(m, "config.json/config.json"));
  m = load_refusal(dir.string());  // the model directory whose config.json is a directory
  CHECK_MESSAGE(has(m, want), m);
  CHECK_FALSE(has(m, "config.json/config.json"));
  std::filesystem::remove_all(dir);
}

TEST_CASE("sizes are bounded at load, naming the field and the limit") {
  const struct {
    const char* key;
    const char* value;
    const char* says;
  } cases[] = {
      {"hidden_size", "65537", "hidden_size = 65537 exceeds the limit 65536"},
      {"hidden_size", "2147483647", "hidden_size = 2147483647 exceeds the limit 65536"},
      {"num_hidden_layers", "1025", "num_hidden_layers = 1025 exceeds the limit 1024"},
      {"vocab_size", "16777217", "vocab_size = 16777217 exceeds the limit 16777216"},
      {"kda_num_heads", "1025", "num_heads = 1025 exceeds the limit 1024"},
      {"kda_head_dim", "4097", "head_dim = 4097 exceeds the limit 4096"},
      {"short_conv_kernel_size", "257", "short_conv_kernel_size = 257 exceeds the limit 256"},
      {"num_attention_heads", "1025", "num_attention_heads = 1025 exceeds the limit 1024"},
      {"q_lora_rank", "65537", "q_lora_rank = 65537 exceeds the limit 65536"},
      {"kv_lora_rank", "65537", "kv_lora_rank = 65537 exceeds the limit 65536"},
      {"qk_nope_head_dim", "2147483647", "qk_nope_head_dim = 2147483647 exceeds the limit 4096"},
      {"qk_rope_head_dim", "2147483647", "qk_rope_head_dim = 2147483647 exceeds the limit 4096"},
      {"v_head_dim", "4097", "v_head_dim = 4097 exceeds the limit 4096"},
      {"num_experts", "65537", "num_experts = 65537 exceeds the limit 65536"},
      {"num_shared_experts", "257", "num_shared_experts = 257 exceeds the limit 256"},
      {"routed_expert_hidden_size", "65537", "routed_expert_hidden_size = 65537 exceeds the limit 65536"},
      {"moe_intermediate_size", "262145", "moe_intermediate_size = 262145 exceeds the limit 262144"},
      {"intermediate_size", "1048577", "intermediate_size = 1048577 exceeds the limit 1048576"},
      {"attn_res_block_size", "1025", "attn_res_block_size = 1025 exceeds the limit 1024"},
  };
  for (const auto& c : cases) {
    CAPTURE(c.key);
    const std::string m = refusal(flat({{c.key, c.value}}), "cfg/config.json");
    CHECK_MESSAGE(has(m, "cfg/config.json: " + std::string(c.says)), m);
  }
  // Unused by any layer, intermediate_size may be 0 but not negative.
  CHECK(has(refusal(flat({{"first_k_dense_replace", "0"}, {"intermediate_size", "-2147483648"}})),
            "intermediate_size = -2147483648 must be at least 0"));
  // Each field within its limit, the tensors they size together may not be.
  CHECK(parse_config(flat({{"vocab_size", "16777216"}, {"hidden_size", "65536"}}), "x").vocab == 16777216);
  CHECK(has(
      refusal(flat(
          {{"num_shared_experts", "256"}, {"moe_intermediate_size", "262144"}, {"hidden_size", "65536"}})),
      "num_shared_experts x moe_intermediate_size x hidden_size = 4398046511104 exceeds the limit "
      "1099511627776"));
  CHECK(has(refusal(flat({{"num_hidden_layers", "1024"},
                          {"num_experts", "65536"},
                          {"moe_intermediate_size", "262144"},
                          {"routed_expert_hidden_size", "65536"}})),
            "num_hidden_layers x num_experts x moe_intermediate_size x routed_expert_hidden_size = "
            "1152921504606846976 exceeds the limit 1125899906842624"));
  // An epsilon that is no epsilon: 1e300 is inf as a float32 and zeroes every norm's output.
  for (const char* eps : {"1e300", "0", "-1e-5", "2"}) {
    CAPTURE(eps);
    CHECK(has(refusal(flat({{"rms_norm_eps", eps}})), "rms_norm_eps = "));
  }
}

TEST_CASE("the limits leave room: the released dimensions, and each field at its limit, load") {
  CHECK(parse_config(real_nested(), "x").hidden == 7168);
  const ModelConfig c = parse_config(flat({{"hidden_size", "65536"},
                                           {"num_hidden_layers", "1024"},
                                           {"vocab_size", "16777216"},
                                           {"kda_num_heads", "1024"},
                                           {"kda_head_dim", "4096"},
                                           {"num_experts", "65536"},
                                           {"num_experts_per_token", "64"},
                                           {"moe_intermediate_size", "262144"},
                                           {"routed_expert_hidden_size", "64"},
                                           {"intermediate_size", "1048576"}}),
                                     "x");
  CHECK(c.vocab == 16777216);
  CHECK(c.n_experts == 65536);
}
