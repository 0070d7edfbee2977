// stages/tensors.*: the tensor list asks for exactly the released names. Driven against the full-scale
// header-only replica of the real checkpoint (`k3flow synth --sparse`, 497,220 tensors, 96 shards)
// and against fixtures/tiny-k3.
#include <doctest/doctest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include "io/config.hpp"
#include "io/safetensors.hpp"
#include "stages/tensors.hpp"
#include "tests/fixture_json.hpp"
#include "tests/sparse_replica.hpp"
#include "tests/temp_dir.hpp"

namespace fs = std::filesystem;
using namespace k3;

namespace {

struct Replica {
  fs::path dir = test::sparse_replica();
  io::ModelConfig cfg = io::load_config(dir / "config.json");
  io::ShardSet shards = io::ShardSet::open(dir);
};

Replica& replica() {
  static Replica r;
  return r;
}

std::vector<std::string> names(const std::vector<stages::TensorSpec>& specs) {
  std::vector<std::string> out;
  for (const auto& s : specs) out.push_back(s.name);
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<std::string> prefixed(const std::string& prefix, std::vector<std::string> suffixes) {
  for (auto& s : suffixes) s = prefix + s;
  std::sort(suffixes.begin(), suffixes.end());
  return suffixes;
}

const std::vector<std::string> kCommon = {"input_layernorm.weight",
                                          "post_attention_layernorm.weight",
                                          "self_attention_res_norm.weight",
                                          "self_attention_res_proj.weight",
                                          "mlp_res_norm.weight",
                                          "mlp_res_proj.weight"};
const std::vector<std::string> kKda = {
    "self_attn.q_proj.weight",   "self_attn.k_proj.weight",   "self_attn.v_proj.weight",
    "self_attn.g_proj.weight",   "self_attn.o_proj.weight",   "self_attn.q_conv1d.weight",
    "self_attn.k_conv1d.weight", "self_attn.v_conv1d.weight", "self_attn.f_a_proj.weight",
    "self_attn.f_b_proj.weight", "self_attn.b_proj.weight",   "self_attn.A_log",
    "self_attn.dt_bias",         "self_attn.o_norm.weight"};
const std::vector<std::string> kMla = {
    "self_attn.q_a_proj.weight",       "self_attn.q_a_layernorm.weight",
    "self_attn.q_b_proj.weight",       "self_attn.kv_a_proj_with_mqa.weight",
    "self_attn.kv_a_layernorm.weight", "self_attn.kv_b_proj.weight",
    "self_attn.o_proj.weight",         "self_attn.g_proj.weight"};
const std::vector<std::string> kDense = {"mlp.gate_proj.weight", "mlp.up_proj.weight",
                                         "mlp.down_proj.weight"};
const std::vector<std::string> kMoe = {"block_sparse_moe.gate.weight",
                                       "block_sparse_moe.gate.e_score_correction_bias",
                                       "block_sparse_moe.routed_expert_down_proj.weight",
                                       "block_sparse_moe.routed_expert_up_proj.weight",
                                       "block_sparse_moe.routed_expert_norm.weight",
                                       "block_sparse_moe.shared_experts.gate_proj.weight",
                                       "block_sparse_moe.shared_experts.up_proj.weight",
                                       "block_sparse_moe.shared_experts.down_proj.weight"};

std::vector<std::string> cat(std::vector<std::string> a, const std::vector<std::string>& b,
                             const std::vector<std::string>& c) {
  a.insert(a.end(), b.begin(), b.end());
  a.insert(a.end(), c.begin(), c.end());
  return a;
}

// Every name of `layer.` in the checkpoint that is not a routed expert.
std::vector<std::string> trunk_names_in(const io::ShardSet& shards, int layer) {
  const std::string p = stages::layer_prefix(layer);
  std::vector<std::string> out;
  shards.for_each([&](std::string_view name, const io::TensorInfo&) {
    if (name.starts_with(p) && name.find(".experts.") == std::string_view::npos) out.emplace_back(name);
  });
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

TEST_CASE(
    "sparse replica: the tensor list asks for exactly the released names of KDA, MLA, dense and MoE layers") {
  Replica& r = replica();
  const io::ModelConfig& c = r.cfg;
  REQUIRE(c.n_layers == 93);
  REQUIRE(r.shards.tensor_count() == 497'220);

  struct Want {
    int layer;
    bool mla, dense;
  };
  for (const Want w : {Want{0, false, true}, Want{1, false, false}, Want{3, true, false},
                       Want{91, true, false}, Want{92, true, false}}) {
    CAPTURE(w.layer);
    const stages::LayerTensors p = stages::layer_tensors(c, w.layer);
    CHECK((p.kind.attention == io::LayerAttention::mla) == w.mla);
    CHECK((p.kind.ffn == io::LayerFfn::dense) == w.dense);
    const auto want =
        prefixed(stages::layer_prefix(w.layer), cat(kCommon, w.mla ? kMla : kKda, w.dense ? kDense : kMoe));
    CHECK(names(p.tensors) == want);
    // ... and that is everything the checkpoint has for the layer's trunk.
    CHECK(trunk_names_in(r.shards, w.layer) == want);
  }
  CHECK(stages::layer_tensors(c, 0).tensors.front().name ==
        "language_model.model.layers.0.input_layernorm.weight");
  CHECK(names(stages::model_tensors(c)) == std::vector<std::string>{
                                               "language_model.lm_head.weight",
                                               "language_model.model.embed_tokens.weight",
                                               "language_model.model.norm.weight",
                                               "language_model.model.output_attn_res_norm.weight",
                                               "language_model.model.output_attn_res_proj.weight",
                                           });
  CHECK(names(stages::expert_tensors(c, 92, 895, stages::ExpertFormat::mxfp4)) ==
        prefixed("language_model.model.layers.92.block_sparse_moe.experts.895.",
                 {"w1.weight_packed", "w1.weight_scale", "w2.weight_packed", "w2.weight_scale",
                  "w3.weight_packed", "w3.weight_scale"}));
}

TEST_CASE("sparse replica: every listed tensor of all 93 layers is found with the expected element count") {
  Replica& r = replica();
  const io::ModelConfig& c = r.cfg;
  size_t listed = 0;
  uint64_t trunk_bytes = 0, largest = 0;
  for (int l = 0; l < c.n_layers; ++l) {
    CAPTURE(l);
    const stages::Layout lay = stages::locate(stages::layer_tensors(c, l).tensors, r.shards, c);
    for (size_t i = 0; i < lay.specs.size(); ++i) {
      CHECK(lay.places[i].info.numel() == lay.specs[i].numel());  // A_log: D stored, H used
    }
    CHECK(lay.contiguous);  // one trunk run per layer, one read
    listed += lay.specs.size();
    trunk_bytes += lay.buffer_bytes;
    largest = std::max(largest, lay.buffer_bytes);
  }
  const stages::Layout head = stages::locate(stages::model_tensors(c), r.shards, c);
  CHECK(head.specs.size() == 5);
  MESSAGE("93 layer trunks: " << listed << " tensors, " << trunk_bytes << " bytes, largest run " << largest);
  CHECK(listed == 69 * 28 + 24 * 22 - 5);  // layer 0: 3 dense instead of 8 MoE tensors
  CHECK(trunk_bytes / 1e9 == doctest::Approx(108.81).epsilon(0.001));  // docs/engine.md §1.4
  CHECK(largest / 1e9 == doctest::Approx(2.341).epsilon(0.001));

  // Experts: the MXFP4 form, validated, one contiguous 17,547,264-byte run each.
  size_t experts = 0;
  for (int l = 1; l < c.n_layers; ++l) {
    for (int e = 0; e < c.n_experts; ++e) {
      const stages::Layout x = stages::locate_expert(r.shards, c, l, e);
      if (x.specs.size() != 6 || !x.contiguous || x.buffer_bytes != 17'547'264) {
        FAIL_CHECK("expert " << l << "." << e << " is not one 17,547,264-byte MXFP4 run");
      }
      ++experts;
    }
  }
  CHECK(experts == 82'432);
}

TEST_CASE("tiny checkpoint: dense F32 experts and A_log with exactly H values are accepted") {
  const io::ModelConfig c = io::load_config(test::fixture_path("tiny-k3/config.json"));
  const io::ShardSet shards = io::ShardSet::open(test::fixture_path("tiny-k3"));
  for (int l = 0; l < c.n_layers; ++l) {
    const stages::Layout lay = stages::locate(stages::layer_tensors(c, l).tensors, shards, c);
    CHECK(lay.contiguous);
    if (!c.is_dense(l)) {
      const stages::Layout x = stages::locate_expert(shards, c, l, 7);
      REQUIRE(x.specs.size() == 3);
      CHECK(x.specs[0].name == stages::expert_prefix(l, 7) + "w1.weight");
      CHECK(x.specs[0].field == stages::Field::expert_w1);
    }
  }
  const auto a_log = shards.find("language_model.model.layers.0.self_attn.A_log");
  REQUIRE(a_log);
  CHECK(a_log->numel() == 4);
}
