// `k3flow inspect MODEL_DIR [--json]`: config summary, layer map, tensor census by dtype and role,
// bytes per trunk layer and per expert, always-resident bytes, index cost — read from the headers
// only, so it runs in seconds on the 1.56 TB checkpoint (or its sparse replica).
#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "io/config.hpp"
#include "io/error.hpp"
#include "io/json_text.hpp"
#include "io/released_tensors.hpp"
#include "io/safetensors.hpp"
#include "io/safetensors_writer.hpp"
#include "pipeline/cli/commands.hpp"
#include "pipeline/support/human_bytes.hpp"
#include "pipeline/support/output_file.hpp"

namespace k3::pipeline {

namespace {

namespace fs = std::filesystem;

enum class TensorRole { trunk, expert, embedding, head, other };
constexpr const char* kRoleNames[] = {"trunk", "expert", "embedding", "head", "other"};
constexpr const char* kDtypeNames[] = {"U8", "BF16", "F16", "F32"};
struct ParsedName {
  TensorRole role = TensorRole::other;
  int layer = -1, expert = -1;
};

// Roles by released name (docs/model.md §2.1). The model-level norm and AttnRes pair belong to the head.
ParsedName classify(std::string_view name) {
  using K = io::NameOwner::Kind;
  const io::NameOwner o = io::owner_of(name);
  switch (o.kind) {
    case K::model:
      return {o.field == io::TensorField::embed ? TensorRole::embedding : TensorRole::head, -1, -1};
    case K::layer_trunk:
      return {TensorRole::trunk, o.layer, -1};
    case K::expert:
      return {TensorRole::expert, o.layer, o.expert};
    case K::other:
      break;
  }
  return {};
}

// Bytes and extent of a group of tensors that should form one contiguous run in one shard.
struct Run {
  uint64_t bytes = 0, begin = UINT64_MAX, end = 0;
  uint32_t tensors = 0, shard = 0;
  bool one_shard = true;
  void add(const io::TensorInfo& t) {
    if (tensors == 0) shard = t.shard;
    one_shard = one_shard && t.shard == shard;
    ++tensors;
    bytes += t.nbytes;
    begin = std::min(begin, t.offset);
    end = std::max(end, t.offset + t.nbytes);
  }
  bool contiguous() const { return tensors > 0 && one_shard && end - begin == bytes; }
};

struct Count {
  uint64_t tensors = 0, bytes = 0;
};

struct Census {
  io::ModelConfig cfg;
  size_t tensors = 0, shards = 0, index_bytes = 0;
  uint64_t file_bytes = 0, tensor_bytes = 0;
  Count by_dtype[4], by_role[5];
  std::vector<Run> trunk;                     // per layer
  std::unordered_map<uint64_t, Run> experts;  // key layer << 32 | expert
  std::vector<int> experts_in_layer;          // distinct experts seen per layer
  uint64_t expert_min = 0, expert_max = 0, expert_mode = 0;
  size_t experts_contiguous = 0, experts_six = 0;
  size_t trunk_contiguous = 0;
  std::vector<std::string> problems;
};

Census take_census(const fs::path& dir) {
  check_model_dir(dir);
  Census c;
  c.cfg = io::load_config(dir / "config.json");
  io::ShardSet set = io::ShardSet::open(dir);
  c.tensors = set.tensor_count();
  c.shards = set.shard_count();
  c.index_bytes = set.index_bytes();
  for (uint32_t s = 0; s < c.shards; ++s) c.file_bytes += set.shard_size(s);
  const int L = c.cfg.n_layers;
  c.trunk.resize(L);
  c.experts_in_layer.assign(L, 0);
  c.experts.reserve(static_cast<size_t>(std::max(0, L - c.cfg.first_dense)) * std::max(0, c.cfg.n_experts));

  set.for_each([&](std::string_view name, const io::TensorInfo& t) {
    c.tensor_bytes += t.nbytes;
    auto& d = c.by_dtype[static_cast<int>(t.dtype)];
    ++d.tensors, d.bytes += t.nbytes;
    ParsedName p = classify(name);
    if (p.layer >= L) {
      if (c.problems.size() < 8)
        c.problems.push_back(fmt::format("{} names a layer beyond num_hidden_layers", name));
      p = {};
    }
    auto& r = c.by_role[static_cast<int>(p.role)];
    ++r.tensors, r.bytes += t.nbytes;
    if (p.role == TensorRole::trunk) c.trunk[p.layer].add(t);
    if (p.role == TensorRole::expert) {
      Run& e = c.experts[(uint64_t(p.layer) << 32) | uint32_t(p.expert)];
      if (e.tensors == 0) ++c.experts_in_layer[p.layer];
      e.add(t);
    }
  });

  std::map<uint64_t, size_t> sizes;
  for (const auto& [key, e] : c.experts) {
    ++sizes[e.bytes];
    c.experts_contiguous += e.contiguous();
    c.experts_six += e.tensors == 6;
  }
  if (!sizes.empty()) {
    c.expert_min = sizes.begin()->first;
    c.expert_max = sizes.rbegin()->first;
    c.expert_mode = std::max_element(sizes.begin(), sizes.end(), [](auto& a, auto& b) {
                      return a.second < b.second;
                    })->first;
  }
  for (int l = 0; l < L; ++l) {
    c.trunk_contiguous += c.trunk[l].contiguous();
    if (c.trunk[l].tensors == 0) c.problems.push_back(fmt::format("layer {} has no trunk tensors", l));
    const int want = c.cfg.is_dense(l) ? 0 : c.cfg.n_experts;
    if (c.experts_in_layer[l] != want)
      c.problems.push_back(
          fmt::format("layer {} has {} routed experts, config says {}", l, c.experts_in_layer[l], want));
  }
  if (c.experts_contiguous != c.experts.size())
    c.problems.push_back(fmt::format("{} of {} experts are not one contiguous run",
                                     c.experts.size() - c.experts_contiguous, c.experts.size()));
  if (c.experts_six != c.experts.size())
    c.problems.push_back(
        fmt::format("{} experts do not have exactly six tensors", c.experts.size() - c.experts_six));
  if (c.trunk_contiguous != static_cast<size_t>(L))
    c.problems.push_back(
        fmt::format("{} of {} layers' trunk tensors are not one contiguous run", L - c.trunk_contiguous, L));
  if (auto e = set.find(io::model_tensor_name(io::TensorField::embed))) {
    if (e->shape[0] != uint64_t(c.cfg.vocab) || e->shape[1] != uint64_t(c.cfg.hidden))
      c.problems.push_back(fmt::format("embed_tokens is [{}, {}], config says [{}, {}]", e->shape[0],
                                       e->shape[1], c.cfg.vocab, c.cfg.hidden));
  } else {
    c.problems.push_back(fmt::format("no {}", io::model_tensor_name(io::TensorField::embed)));
  }
  if (!set.find(io::model_tensor_name(io::TensorField::lm_head)))
    c.problems.push_back(fmt::format("no {}", io::model_tensor_name(io::TensorField::lm_head)));
  return c;
}

std::string layer_map(const io::ModelConfig& cfg) {
  std::string m;
  for (int l = 0; l < cfg.n_layers; ++l) m += cfg.is_mla(l) ? 'M' : 'K';
  return m;
}

struct TrunkStats {
  uint64_t min = 0, max = 0, total = 0;
  double mean = 0;
};

TrunkStats trunk_stats(const Census& c) {
  TrunkStats s;
  if (c.trunk.empty()) return s;
  s.min = UINT64_MAX;
  for (const Run& r : c.trunk) {
    s.min = std::min(s.min, r.bytes);
    s.max = std::max(s.max, r.bytes);
    s.total += r.bytes;
  }
  s.mean = double(s.total) / c.trunk.size();
  return s;
}

uint64_t resident_bytes(const Census& c) {
  return c.by_role[int(TensorRole::embedding)].bytes + c.by_role[int(TensorRole::head)].bytes;
}

void print_json(const Census& c, const fs::path& dir) {
  const io::ModelConfig& g = c.cfg;
  const TrunkStats ts = trunk_stats(c);
  // One top-level member per line: the census is read by people as well as by scripts.
  io::JsonWriter w({.spaced = true, .top_lines = true});
  std::vector<uint64_t> per_layer;
  for (const auto& t : c.trunk) per_layer.push_back(t.bytes);
  w.begin_object()
      .field("model_dir", dir.string())
      .field("config_shape", g.nested ? "nested" : "flat")
      .field("shards", c.shards)
      .field("tensors", c.tensors)
      .field("total_bytes", c.file_bytes)
      .field("tensor_bytes", c.tensor_bytes)
      .field("header_bytes", c.file_bytes - c.tensor_bytes)
      .field("hidden", g.hidden)
      .field("vocab", g.vocab)
      .field("layers", g.n_layers)
      .field("kda_layers", g.kda_layer_count())
      .field("mla_layers", g.mla_layer_count())
      .field("dense_layers", std::min(g.first_dense, g.n_layers))
      .field("moe_layers", g.n_layers - std::min(g.first_dense, g.n_layers))
      .field("layer_map", layer_map(g))
      .field("full_attn_layers", g.full_attn_layers)
      .field("kda_heads", g.kda_heads)
      .field("kda_head_dim", g.kda_head_dim)
      .field("conv_kernel", g.conv_kernel)
      .field("mla_heads", g.mla_heads)
      .field("q_lora_rank", g.q_lora_rank)
      .field("kv_lora_rank", g.kv_lora_rank)
      .field("qk_nope_head_dim", g.qk_nope)
      .field("qk_rope_head_dim", g.qk_rope)
      .field("v_head_dim", g.v_head)
      .field("experts", g.n_experts)
      .field("top_k", g.top_k)
      .field("shared_experts", g.n_shared)
      .field("latent", g.latent)
      .field("moe_inter", g.moe_inter)
      .field("dense_inter", g.dense_inter)
      .field("attn_res_block_size", g.attn_res_block)
      .field("expert_bytes", c.expert_mode)
      .field("expert_bytes_min", c.expert_min)
      .field("expert_bytes_max", c.expert_max)
      .field("expert_blobs", c.experts.size())
      .field("experts_contiguous", c.experts_contiguous)
      .field("trunk_bytes", ts.total)
      .key("trunk_layer_bytes")
      .begin_object()
      .field("min", ts.min)
      .field("max", ts.max)
      .fixed_field("mean", ts.mean, 1)
      .end_object()
      .field("trunk_bytes_per_layer", per_layer)
      .field("trunk_layers_contiguous", c.trunk_contiguous)
      .field("resident_bytes", resident_bytes(c))
      .field("index_bytes", c.index_bytes)
      .fixed_field("index_bytes_per_tensor", c.tensors ? double(c.index_bytes) / c.tensors : 0.0, 2)
      .key("dtypes")
      .begin_object();
  for (int i = 0; i < 4; ++i)
    if (c.by_dtype[i].tensors)
      w.key(kDtypeNames[i])
          .begin_object()
          .field("tensors", c.by_dtype[i].tensors)
          .field("bytes", c.by_dtype[i].bytes)
          .end_object();
  w.end_object().key("roles").begin_object();
  for (int i = 0; i < 5; ++i)
    w.key(kRoleNames[i])
        .begin_object()
        .field("tensors", c.by_role[i].tensors)
        .field("bytes", c.by_role[i].bytes)
        .end_object();
  w.end_object().field("problems", c.problems).end_object();
  fmt::print("{}\n", w.str());
}

void print_text(const Census& c, const fs::path& dir) {
  const io::ModelConfig& g = c.cfg;
  const TrunkStats ts = trunk_stats(c);
  auto hb = [](uint64_t b) { return human_bytes(double(b)); };
  fmt::print("checkpoint  {}: {} shards, {} tensors, {} ({} B; headers {})\n", dir.string(), c.shards,
             c.tensors, hb(c.file_bytes), c.file_bytes, hb(c.file_bytes - c.tensor_bytes));
  fmt::print("{}\n", g.summary());
  fmt::print(
      "dims        hidden {}, vocab {}; KDA {}x{} conv {}; MLA {} heads q_lora {} kv_lora {} nope {} rope {} "
      "v {}\n",
      g.hidden, g.vocab, g.kda_heads, g.kda_head_dim, g.conv_kernel, g.mla_heads, g.q_lora_rank,
      g.kv_lora_rank, g.qk_nope, g.qk_rope, g.v_head);
  fmt::print("moe         {} experts, top-{}, {} shared, latent {}, inter {}; {} dense layer(s) of {}\n",
             g.n_experts, g.top_k, g.n_shared, g.latent, g.moe_inter, std::min(g.first_dense, g.n_layers),
             g.dense_inter);
  fmt::print("layer map   {} ({} KDA, {} MLA)\n", layer_map(g), g.kda_layer_count(), g.mla_layer_count());
  fmt::print("dtypes     ");
  for (int i = 0; i < 4; ++i)
    if (c.by_dtype[i].tensors)
      fmt::print(" {} {} tensors {};", kDtypeNames[i], c.by_dtype[i].tensors, hb(c.by_dtype[i].bytes));
  fmt::print("\nroles      ");
  for (int i = 0; i < 5; ++i)
    fmt::print(" {} {} tensors {};", kRoleNames[i], c.by_role[i].tensors, hb(c.by_role[i].bytes));
  fmt::print("\ntrunk       {} total; per layer min {} / max {} / mean {}; {} of {} layers contiguous\n",
             hb(ts.total), hb(ts.min), hb(ts.max), hb(uint64_t(ts.mean)), c.trunk_contiguous, c.trunk.size());
  fmt::print("experts     {} blobs of {} B ({}){}; {} contiguous\n", c.experts.size(), c.expert_mode,
             hb(c.expert_mode),
             c.expert_min != c.expert_max ? fmt::format(" (sizes {}..{})", c.expert_min, c.expert_max) : "",
             c.experts_contiguous);
  fmt::print("resident    {} (embedding + lm_head + final norm + output AttnRes pair)\n",
             hb(resident_bytes(c)));
  fmt::print("index       {} for {} tensors = {:.1f} B/tensor\n", hb(c.index_bytes), c.tensors,
             c.tensors ? double(c.index_bytes) / c.tensors : 0.0);
  for (const std::string& p : c.problems) fmt::print("problem     {}\n", p);
}

}  // namespace

Action add_inspect(CLI::App& sub) {
  struct Args {
    std::string dir;
    bool json = false;
  };
  auto a = std::make_shared<Args>();
  sub.add_option("MODEL_DIR", a->dir, "checkpoint directory (config.json + *.safetensors)")->required();
  sub.add_flag("--json", a->json, "print one JSON object instead of text");
  return [a] {
    const Census c = take_census(a->dir);
    if (a->json)
      print_json(c, a->dir);
    else
      print_text(c, a->dir);
    return 0;
  };
}

}  // namespace k3::pipeline
