#include "stages/tensors.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <optional>

#include "io/aligned.hpp"
#include "io/error.hpp"

namespace k3::stages {

namespace {

struct FieldInfo {
  const char* name;
  Storage storage;
};

FieldInfo info_of(Field f) {
  switch (f) {
    case Field::input_norm:
      return {"input_layernorm", Storage::vector};
    case Field::post_attn_norm:
      return {"post_attention_layernorm", Storage::vector};
    case Field::attn_res_norm:
      return {"self_attention_res_norm", Storage::vector};
    case Field::attn_res_proj:
      return {"self_attention_res_proj", Storage::vector};
    case Field::mlp_res_norm:
      return {"mlp_res_norm", Storage::vector};
    case Field::mlp_res_proj:
      return {"mlp_res_proj", Storage::vector};
    case Field::kda_q:
      return {"kda.q_proj", Storage::matrix};
    case Field::kda_k:
      return {"kda.k_proj", Storage::matrix};
    case Field::kda_v:
      return {"kda.v_proj", Storage::matrix};
    case Field::kda_g:
      return {"kda.g_proj", Storage::matrix};
    case Field::kda_o:
      return {"kda.o_proj", Storage::matrix};
    case Field::kda_q_conv:
      return {"kda.q_conv1d", Storage::vector};
    case Field::kda_k_conv:
      return {"kda.k_conv1d", Storage::vector};
    case Field::kda_v_conv:
      return {"kda.v_conv1d", Storage::vector};
    case Field::kda_f_a:
      return {"kda.f_a_proj", Storage::matrix};
    case Field::kda_f_b:
      return {"kda.f_b_proj", Storage::matrix};
    case Field::kda_b:
      return {"kda.b_proj", Storage::matrix};
    case Field::kda_a_log:
      return {"kda.A_log", Storage::vector};
    case Field::kda_dt_bias:
      return {"kda.dt_bias", Storage::vector};
    case Field::kda_o_norm:
      return {"kda.o_norm", Storage::vector};
    case Field::mla_q_a:
      return {"mla.q_a_proj", Storage::matrix};
    case Field::mla_q_a_norm:
      return {"mla.q_a_layernorm", Storage::vector};
    case Field::mla_q_b:
      return {"mla.q_b_proj", Storage::matrix};
    case Field::mla_kv_a:
      return {"mla.kv_a_proj_with_mqa", Storage::matrix};
    case Field::mla_kv_a_norm:
      return {"mla.kv_a_layernorm", Storage::vector};
    case Field::mla_kv_b:
      return {"mla.kv_b_proj", Storage::matrix};
    case Field::mla_o:
      return {"mla.o_proj", Storage::matrix};
    case Field::mla_g:
      return {"mla.g_proj", Storage::matrix};
    case Field::dense_gate:
      return {"mlp.gate_proj", Storage::matrix};
    case Field::dense_up:
      return {"mlp.up_proj", Storage::matrix};
    case Field::dense_down:
      return {"mlp.down_proj", Storage::matrix};
    // The router is widened to f32 at bind in the references; kept as a matrix view here (same
    // bits: the router kernel widens bf16 exactly).
    case Field::moe_router:
      return {"moe.gate", Storage::matrix};
    case Field::moe_bias:
      return {"moe.e_score_correction_bias", Storage::vector};
    case Field::moe_down:
      return {"moe.routed_expert_down_proj", Storage::matrix};
    case Field::moe_up:
      return {"moe.routed_expert_up_proj", Storage::matrix};
    case Field::moe_norm:
      return {"moe.routed_expert_norm", Storage::vector};
    case Field::shared_gate:
      return {"moe.shared_experts.gate_proj", Storage::matrix};
    case Field::shared_up:
      return {"moe.shared_experts.up_proj", Storage::matrix};
    case Field::shared_down:
      return {"moe.shared_experts.down_proj", Storage::matrix};
    case Field::expert_w1:
      return {"expert.w1", Storage::matrix};
    case Field::expert_w2:
      return {"expert.w2", Storage::matrix};
    case Field::expert_w3:
      return {"expert.w3", Storage::matrix};
    case Field::expert_w1_packed:
      return {"expert.w1.weight_packed", Storage::mxfp4};
    case Field::expert_w1_scale:
      return {"expert.w1.weight_scale", Storage::mxfp4};
    case Field::expert_w2_packed:
      return {"expert.w2.weight_packed", Storage::mxfp4};
    case Field::expert_w2_scale:
      return {"expert.w2.weight_scale", Storage::mxfp4};
    case Field::expert_w3_packed:
      return {"expert.w3.weight_packed", Storage::mxfp4};
    case Field::expert_w3_scale:
      return {"expert.w3.weight_scale", Storage::mxfp4};
    case Field::embed:
      return {"embed_tokens", Storage::matrix};
    case Field::final_norm:
      return {"norm", Storage::vector};
    case Field::out_res_norm:
      return {"output_attn_res_norm", Storage::vector};
    case Field::out_res_proj:
      return {"output_attn_res_proj", Storage::vector};
    case Field::lm_head:
      return {"lm_head", Storage::matrix};
  }
  return {"?", Storage::vector};
}

uint64_t u(int v) {
  return static_cast<uint64_t>(v);
}

}  // namespace

const char* field_name(Field f) {
  return info_of(f).name;
}
Storage storage_of(Field f) {
  return info_of(f).storage;
}

uint64_t TensorSpec::numel() const {
  uint64_t n = 1;
  for (uint64_t d : shape) n *= d;
  return n;
}

namespace {

TensorSpec spec(io::ReleasedTensor t) {
  return {std::move(t.name), std::move(t.shape), t.field};
}

std::vector<TensorSpec> specs(std::vector<io::ReleasedTensor> ts) {
  std::vector<TensorSpec> out;
  out.reserve(ts.size());
  for (io::ReleasedTensor& t : ts) out.push_back(spec(std::move(t)));
  return out;
}

}  // namespace

LayerTensors layer_tensors(const io::ModelConfig& c, int layer) {
  return {layer, c.layer(layer), specs(io::released_layer_trunk(c, layer))};
}

std::vector<TensorSpec> model_tensors(const io::ModelConfig& c) {
  return specs(io::released_model_tensors(c));
}

std::vector<TensorSpec> expert_tensors(const io::ModelConfig& c, int layer, int expert, ExpertFormat format) {
  return specs(io::released_expert(c, layer, expert, format));
}

namespace {

bool dtype_ok(Storage s, io::DType d) {
  if (s == Storage::mxfp4) return d == io::DType::U8;
  return d == io::DType::F32 || d == io::DType::BF16 || d == io::DType::F16;
}

// Widened floats a tensor needs if its bytes start at `addr_mod8` (mod 8).
uint64_t widen_need(const TensorSpec& s, const io::TensorInfo& t, uint64_t addr_mod8) {
  switch (storage_of(s.field)) {
    case Storage::vector:
      return t.numel();
    case Storage::mxfp4:
      return 0;
    case Storage::matrix:
      if (t.dtype == io::DType::F16) return t.numel();
      return addr_mod8 % io::dtype_size(t.dtype) == 0 ? 0 : t.numel();
  }
  return 0;
}

}  // namespace

namespace {

// Dimensions other than 1, in order: [128, 1, 4] and [128, 4] are the same layout, [96, 128] and
// [128, 96] are not (a transposed weight has the right element count and the wrong meaning).
std::vector<uint64_t> squeezed(std::span<const uint64_t> dims) {
  std::vector<uint64_t> v;
  for (uint64_t d : dims)
    if (d != 1) v.push_back(d);
  return v;
}

std::string dims_text(std::span<const uint64_t> dims) {
  std::string s;
  for (uint64_t d : dims) s += (s.empty() ? "" : ", ") + std::to_string(d);
  return "[" + s + "]";
}

// The refusals shared by every way of finding a tensor: missing, wrong dtype, wrong element count,
// wrong shape.
void check_found(const TensorSpec& s, const std::optional<io::TensorInfo>& t, const io::ModelConfig& c) {
  if (!t) throw io::runtime_error(fmt::format("bind: missing tensor {}", s.name));
  if (!dtype_ok(storage_of(s.field), t->dtype)) {
    throw io::runtime_error(fmt::format("bind: {} is {}, engine expects {}", s.name, io::dtype_name(t->dtype),
                                        storage_of(s.field) == Storage::mxfp4 ? "U8" : "F32, BF16 or F16"));
  }
  const uint64_t want = s.numel();
  const bool a_log_per_head = s.field == Field::kda_a_log && t->numel() == u(c.kda_heads);
  if (t->numel() != want && !a_log_per_head)
    throw io::runtime_error(
        fmt::format("bind: {} has {} elements, engine expects {}", s.name, t->numel(), want));
  const std::span<const uint64_t> have(t->shape.data(), t->rank);
  // (MXFP4 pairs get their own, more specific shape checks where they are paired.)
  if (!a_log_per_head && storage_of(s.field) != Storage::mxfp4 && squeezed(have) != squeezed(s.shape))
    throw io::runtime_error(
        fmt::format("bind: {} is {}, engine expects {}", s.name, dims_text(have), dims_text(s.shape)));
}

void count_widen(Layout& lay) {
  lay.widen_floats = 0;
  for (size_t i = 0; i < lay.specs.size(); ++i)
    lay.widen_floats +=
        widen_need(lay.specs[i], lay.places[i].info, (lay.base_mod8 + lay.places[i].offset) % 8);
}

}  // namespace

Layout place(std::vector<TensorSpec> specs, const PlacementLookup& lookup, const io::ModelConfig& c,
             uint64_t buffer_bytes, uint32_t base_mod8) {
  Layout lay;
  lay.specs = std::move(specs);
  lay.buffer_bytes = buffer_bytes;
  lay.base_mod8 = base_mod8 % 8;
  for (const TensorSpec& s : lay.specs) {
    const std::optional<Placement> p = lookup(s.name);
    check_found(s, p ? std::optional<io::TensorInfo>(p->info) : std::nullopt, c);
    if (p->offset + p->info.nbytes > buffer_bytes)
      throw io::runtime_error(fmt::format("bind: {} ends at byte {} of a {}-byte buffer", s.name,
                                          p->offset + p->info.nbytes, buffer_bytes));
    lay.places.push_back(*p);
  }
  count_widen(lay);
  return lay;
}

Layout locate(std::vector<TensorSpec> specs, const io::ShardSet& shards, const io::ModelConfig& c) {
  Layout lay;
  lay.specs = std::move(specs);
  lay.places.reserve(lay.specs.size());
  for (const TensorSpec& s : lay.specs) {
    std::optional<io::TensorInfo> t = shards.find(s.name);
    check_found(s, t, c);
    lay.places.push_back({*t, 0});
  }
  if (lay.places.empty()) return lay;

  // One run if every tensor is in one shard and the spans tile [min, max) exactly.
  const uint32_t shard = lay.places[0].info.shard;
  uint64_t lo = UINT64_MAX, hi = 0, sum = 0;
  bool one_shard = true;
  for (const Placement& p : lay.places) {
    one_shard = one_shard && p.info.shard == shard;
    lo = std::min(lo, p.info.offset);
    hi = std::max(hi, p.info.offset + p.info.nbytes);
    sum += p.info.nbytes;
  }
  bool tiles = one_shard && hi - lo == sum;
  if (tiles) {  // equal sum and span can still hide an overlap; check sorted adjacency
    std::vector<std::pair<uint64_t, uint64_t>> spans;
    for (const Placement& p : lay.places) spans.emplace_back(p.info.offset, p.info.nbytes);
    std::sort(spans.begin(), spans.end());
    for (size_t i = 1; i < spans.size() && tiles; ++i)
      tiles = spans[i - 1].first + spans[i - 1].second == spans[i].first;
  }
  lay.contiguous = tiles;
  if (tiles) {
    lay.shard = shard;
    lay.run_begin = lo;
    lay.run_end = hi;
    lay.buffer_bytes = hi - lo;
    lay.base_mod8 = static_cast<uint32_t>(lo % 8);
    for (Placement& p : lay.places) p.offset = p.info.offset - lo;
  } else {
    uint64_t pos = 0;
    for (Placement& p : lay.places) {
      p.offset = io::align_up(pos, 64);
      pos = p.offset + p.info.nbytes;
    }
    lay.buffer_bytes = pos;
    lay.base_mod8 = 0;
  }
  count_widen(lay);
  return lay;
}

Layout locate_expert(const io::ShardSet& shards, const io::ModelConfig& c, int layer, int expert) {
  const bool dense = !shards.find(expert_prefix(layer, expert) + "w1.weight_packed") &&
                     shards.find(expert_prefix(layer, expert) + "w1.weight");
  Layout lay =
      locate(expert_tensors(c, layer, expert, dense ? ExpertFormat::dense : ExpertFormat::mxfp4), shards, c);
  if (dense) return lay;
  // MXFP4 load-time checks (docs/model.md §4), per matrix: packed and scale are U8 (checked above),
  // 2-D, with equal rows and a group size of 32, in the same shard.
  for (size_t m = 0; m < 3; ++m) {
    const io::TensorInfo& pk = lay.places[2 * m].info;
    const io::TensorInfo& sc = lay.places[2 * m + 1].info;
    const std::string& name = lay.specs[2 * m].name;
    const uint64_t rows = lay.specs[2 * m].shape[0], packed_cols = lay.specs[2 * m].shape[1];
    if (pk.rank != 2 || sc.rank != 2)
      throw io::runtime_error(fmt::format("bind: {} (and its scale) must be 2-D", name));
    if (pk.shape[0] != sc.shape[0])
      throw io::runtime_error(
          fmt::format("bind: {} has {} rows but its scale has {}", name, pk.shape[0], sc.shape[0]));
    if (sc.shape[1] * 32 != 2 * pk.shape[1])
      throw io::runtime_error(
          fmt::format("bind: {}: scale columns {} x 32 != 2 x packed columns {} (group size is 32)", name,
                      sc.shape[1], pk.shape[1]));
    if (pk.shape[0] != rows || pk.shape[1] != packed_cols)
      throw io::runtime_error(fmt::format("bind: {} is [{}, {}], engine expects [{}, {}]", name, pk.shape[0],
                                          pk.shape[1], rows, packed_cols));
    if (pk.shard != sc.shard)
      throw io::runtime_error(fmt::format("bind: {} and its scale are in different shards", name));
  }
  return lay;
}

void read_layout(const Layout& lay, const io::ShardSet& shards, std::span<std::byte> dst) {
  if (dst.size() < lay.buffer_bytes)
    throw io::runtime_error(
        fmt::format("bind: layer buffer holds {} bytes, layout needs {}", dst.size(), lay.buffer_bytes));
  if (lay.contiguous) {
    shards.read_range(lay.shard, lay.run_begin, dst.first(lay.buffer_bytes));
    return;
  }
  for (const Placement& p : lay.places) shards.read(p.info, dst.subspan(p.offset, p.info.nbytes));
}

}  // namespace k3::stages
