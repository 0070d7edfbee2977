// The canonical real tensor list: counts, published shard sizes to the byte, expert geometry,
// contiguity of the trunk run and of each expert, and a config that parses to the real values.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <string>
#include <unordered_set>

#include "io/config.hpp"
#include "io/k3_names.hpp"
#include "io/released_tensors.hpp"
#include "io/safetensors_writer.hpp"

using namespace k3::io;

TEST_CASE("every shard lays out at its published size; counts and total match docs/engine.md") {
  uint64_t tensors = 0, total = 0, published = 0;
  std::unordered_set<std::string> names;
  names.reserve(kK3Tensors);
  for (uint32_t s = 0; s < kK3Shards; ++s) {
    const std::vector<TensorEntry> t = k3_shard_tensors(s);
    const ShardLayout l = layout_shard(t, {});
    CHECK_MESSAGE(l.file_size() == k3_published_shard_bytes(s), "shard " << s);
    tensors += t.size();
    total += l.file_size();
    published += k3_published_shard_bytes(s);
    for (const TensorEntry& e : t) {
      CHECK(e.shape.size() <= 4);
      names.insert(e.name);
    }
  }
  CHECK(tensors == kK3Tensors);
  CHECK(names.size() == kK3Tensors);
  CHECK(total == kK3CheckpointBytes);
  CHECK(published == kK3CheckpointBytes);
  CHECK(k3_shard_file_name(0) == "model-00001-of-000096.safetensors");
  CHECK(k3_shard_file_name(95) == "model-00096-of-000096.safetensors");
  CHECK_THROWS(k3_shard_tensors(96));
}

TEST_CASE("per-shard tensor counts and the layer-0 dtype census") {
  auto count = [](uint32_t s) { return k3_shard_tensors(s).size(); };
  CHECK(count(0) == 23);
  CHECK(count(1) == 5404);  // KDA + MoE
  CHECK(count(3) == 5398);  // layer 3, MLA + MoE
  CHECK(count(4) == 5404);
  CHECK(count(91) == 5398);  // layer 91, MLA
  CHECK(count(92) == 5398);  // layer 92, MLA (91 and 92 are consecutive MLA)
  CHECK(count(93) == 5);     // embed, lm_head, final norm, AttnRes pair
  CHECK(count(94) == 5);     // vision: patch embedding + projector
  CHECK(count(95) == 163);   // vision encoder
  std::map<DType, int> census;
  for (const TensorEntry& e : k3_shard_tensors(0)) census[e.dtype]++;
  CHECK(census[DType::BF16] == 17);
  CHECK(census[DType::F32] == 6);
}

TEST_CASE("head shard and the model-level tensors") {
  const std::vector<TensorEntry> h = k3_shard_tensors(kK3Layers);
  REQUIRE(h.size() == 5);
  std::map<std::string, TensorEntry> by;
  for (const TensorEntry& e : h) by.emplace(e.name, e);
  CHECK(by.at("language_model.lm_head.weight").nbytes() == 2'348'810'240ull);
  CHECK(by.at("language_model.model.embed_tokens.weight").nbytes() == 2'348'810'240ull);
  CHECK(by.count("language_model.model.norm.weight") == 1);
  CHECK(by.at("language_model.model.output_attn_res_proj.weight").shape == std::vector<uint64_t>{1, 7168});
}

TEST_CASE(
    "owner_of reads each real name's owner: shard s <= 92 is layer s's trunk or experts, 93 the model "
    "level") {
  using K = NameOwner::Kind;
  for (uint32_t s : {0u, 1u, 3u, 92u}) {
    int trunk = 0, experts = 0;
    std::map<int, int> tensors_of;  // expert id -> its tensors (names sort 0, 1, 10, 100, ...)
    for (const TensorEntry& e : k3_shard_tensors(s)) {
      const NameOwner o = owner_of(e.name);
      CHECK_MESSAGE(o.layer == int(s), e.name);
      const bool is_expert = e.name.find(".block_sparse_moe.experts.") != std::string::npos;
      CHECK_MESSAGE(o.kind == (is_expert ? K::expert : K::layer_trunk), e.name);
      if (is_expert) {
        CHECK(e.name.find(fmt::format(".experts.{}.w", o.expert)) != std::string::npos);
        tensors_of[o.expert]++;
        experts++;
      }
      trunk += o.kind == K::layer_trunk;
    }
    CHECK(experts == (s == 0 ? 0 : 6 * int(kK3Experts)));
    for (const auto& [id, n] : tensors_of) CHECK((id >= 0 && id < int(kK3Experts) && n == 6));
    CHECK(trunk > 0);
  }
  std::map<TensorField, int> model;
  for (const TensorEntry& e : k3_shard_tensors(kK3Layers)) {
    const NameOwner o = owner_of(e.name);
    REQUIRE(o.kind == K::model);
    CHECK(model_tensor_name(o.field) == e.name);
    model[o.field]++;
  }
  CHECK(model.size() == 5);
  for (const TensorEntry& e : k3_shard_tensors(94)) CHECK(owner_of(e.name).kind == K::other);  // vision
  CHECK(owner_of("language_model.model.layers.x.foo").kind == K::other);
  CHECK(owner_of("language_model.model.layers.3.block_sparse_moe.experts.x.w1").kind == K::other);
  CHECK(owner_of("language_model.model.layers.12").kind == K::other);
}

TEST_CASE("experts are 17,547,264 bytes, six adjacent tensors in w1,w2,w3 order after the trunk run") {
  for (uint32_t s : {1u, 4u, 11u, 92u}) {
    const std::vector<TensorEntry> t = k3_shard_tensors(s);
    const ShardLayout l = layout_shard(t, {});
    size_t first_u8 = 0;
    while (t[first_u8].dtype != DType::U8) ++first_u8;
    CHECK(t.size() - first_u8 == 6 * kK3Experts);
    for (size_t i = first_u8; i < t.size(); ++i) CHECK(t[i].dtype == DType::U8);
    for (size_t i = 0; i < first_u8; ++i) CHECK(t[i].name.find(".experts.") == std::string::npos);
    std::unordered_set<std::string> seen;
    for (size_t i = first_u8; i < t.size(); i += 6) {
      const std::string& n = t[i].name;
      const size_t at = n.find(".experts.") + 9;
      const std::string e = n.substr(at, n.find('.', at) - at);
      CHECK(seen.insert(e).second);
      const char* want[] = {"w1.weight_packed", "w1.weight_scale",  "w2.weight_packed",
                            "w2.weight_scale",  "w3.weight_packed", "w3.weight_scale"};
      uint64_t bytes = 0;
      for (int k = 0; k < 6; ++k) {
        CHECK(t[i + k].name == n.substr(0, at) + e + "." + want[k]);
        bytes += t[i + k].nbytes();
        if (k) CHECK(l.offsets[i + k] == l.offsets[i + k - 1] + t[i + k - 1].nbytes());
      }
      CHECK(bytes == kK3ExpertBytes);
    }
    CHECK(seen.size() == kK3Experts);
  }
  const std::vector<TensorEntry> t = k3_shard_tensors(1);
  std::map<std::string, std::vector<uint64_t>> shape;
  for (const TensorEntry& e : t) shape[e.name] = e.shape;
  const std::string x = "language_model.model.layers.1.block_sparse_moe.experts.0.";
  CHECK(shape[x + "w1.weight_packed"] == std::vector<uint64_t>{3072, 1792});
  CHECK(shape[x + "w1.weight_scale"] == std::vector<uint64_t>{3072, 112});
  CHECK(shape[x + "w2.weight_packed"] == std::vector<uint64_t>{3584, 1536});
  CHECK(shape[x + "w2.weight_scale"] == std::vector<uint64_t>{3584, 96});
}

TEST_CASE("layer map of the name list agrees with the real config") {
  const ModelConfig c = parse_config(k3_config_json(), "k3_config_json");
  CHECK(c.nested);
  CHECK(c.n_layers == 93);
  CHECK(c.mla_layer_count() == 24);
  CHECK(c.n_experts == 896);
  CHECK(c.top_k == 16);
  CHECK(c.kda_heads == 96);
  CHECK(c.kda_head_dim == 128);
  for (uint32_t l = 0; l < kK3Layers; ++l) {
    CHECK(c.is_mla(static_cast<int>(l)) == k3_layer_is_mla(l));
    const std::vector<TensorEntry> t = k3_shard_tensors(l);
    const bool has_mla =
        std::any_of(t.begin(), t.end(), [](auto& e) { return e.name.find("q_a_proj") != e.name.npos; });
    const bool has_dense =
        std::any_of(t.begin(), t.end(), [](auto& e) { return e.name.find(".mlp.") != e.name.npos; });
    CHECK(has_mla == c.is_mla(static_cast<int>(l)));
    CHECK(has_dense == c.is_dense(static_cast<int>(l)));
  }
}
