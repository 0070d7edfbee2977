// Dimensions, presets, validation and the tensor list of dense synthetic checkpoints.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <set>

#include "io/error.hpp"
#include "io/released_tensors.hpp"
#include "io/safetensors_writer.hpp"
#include "io/synth/synth.hpp"

namespace k3::io::synth {

namespace {

constexpr int kMxfp4Group = 32;  // docs/model.md §4; = quantization_config.group_size

io::ModelConfig base_dims() {
  io::ModelConfig c;
  c.source = "synth";
  c.nested = true;
  c.rms_eps = 1e-5f;
  c.conv_kernel = 4;
  c.gate_lower_bound = -5.0f;
  c.mla_out_gate = true;
  c.routed_scale = 1.0f;
  c.moe_renormalize = true;
  c.latent_norm = true;
  c.first_dense = 1;
  c.situ_beta = 4.0f;
  c.situ_linear_beta = 25.0f;
  return c;
}

struct Preset {
  const char* name;
  int hidden, layers, vocab, heads, head_dim, mla_heads, q_lora, kv_lora, qk_nope, qk_rope, v_head;
  int experts, top_k, shared, latent, moe_inter, dense_inter, block;
};

// Shaped like K3 (hidden : latent = 2 : 1, many experts, top-k a small fraction, one dense layer,
// MLA every 4th layer and last), only with fewer layers and narrower matrices.
constexpr Preset kPresets[] = {
    {"tiny", 256, 4, 1024, 4, 32, 4, 64, 32, 32, 16, 32, 32, 4, 1, 128, 128, 512, 2},
    {"small", 1024, 6, 8192, 8, 64, 8, 256, 128, 64, 32, 64, 96, 8, 1, 512, 512, 2048, 3},
    {"medium", 2048, 8, 32768, 16, 128, 16, 512, 256, 128, 64, 128, 192, 8, 1, 1024, 1024, 4096, 4},
    {"large", 3072, 12, 65536, 24, 128, 24, 768, 256, 128, 64, 128, 224, 8, 2, 1536, 1536, 8192, 4},
};

[[noreturn]] void refuse(const char* flag, const std::string& why) {
  throw io::usage_error(fmt::format("{} {}", flag, why));
}

void positive(const char* flag, long v, long max) {
  if (v < 1) refuse(flag, fmt::format("must be at least 1 (got {})", v));
  if (v > max) refuse(flag, fmt::format("is too large (got {}, at most {})", v, max));
}

// E8M0 exponent that gives an expert matrix with this fan-in values of standard deviation about
// 1/sqrt(fan_in): random E2M1 codes have an RMS of ~2.93, so 2^(e-127) ≈ 1/(2.93·sqrt(fan_in)).
int scale_center(uint64_t fan_in) {
  int e = 127 + static_cast<int>(std::lround(-std::log2(2.93 * std::sqrt(double(fan_in)))));
  return std::clamp(e, 2, 253);  // jitter ±1 stays inside 1..254
}

// io::data_order_rank applied per layer, so a layer's trunk is one run and, names sorting
// "experts.1." before "experts.10.", each expert's six tensors are one run too.

void sort_data_order(std::vector<SynthTensor>& v) {
  std::sort(v.begin(), v.end(), [](const SynthTensor& a, const SynthTensor& b) {
    const int ra = io::data_order_rank(a.entry.dtype), rb = io::data_order_rank(b.entry.dtype);
    return ra != rb ? ra < rb : a.entry.name < b.entry.name;
  });
}

// How a released tensor is filled (the names, shapes and dtypes are io/released_tensors.hpp's):
// norm gains 1 + N(0, 0.02); projections, conv taps and the AttnRes pseudo-queries N(0, 1/sqrt(fan-in))
// with the fan-in the last dimension; the embedding unit scale (its rows enter the stream directly,
// like a layer's output); small N(0, sd) for the KDA dt_bias and the router's score bias; A_log per
// head; MXFP4 codes and scales centred for the expert's fan-in.
SynthTensor synth_tensor(const io::ModelConfig& c, io::ReleasedTensor r, int layer, int expert) {
  using F = io::TensorField;
  SynthTensor t{io::TensorEntry{std::move(r.name), r.dtype, std::move(r.shape)}, layer, expert, Fill::normal};
  const uint64_t fan_in = t.entry.shape.back();
  switch (r.field) {
    case F::input_norm:
    case F::post_attn_norm:
    case F::attn_res_norm:
    case F::mlp_res_norm:
    case F::kda_o_norm:
    case F::mla_q_a_norm:
    case F::mla_kv_a_norm:
    case F::moe_norm:
    case F::final_norm:
    case F::out_res_norm:
      t.fill = Fill::gain;
      t.scale = 0.02f;
      break;
    case F::kda_dt_bias:
      t.scale = 0.1f;
      break;
    case F::moe_bias:
      t.scale = 0.05f;
      break;
    case F::kda_a_log:  // per HEAD, stored with head_dim values: the rest are exactly 0 (docs/model.md §2.1)
      t.fill = Fill::a_log;
      t.valid = c.kda_heads;
      break;
    case F::embed:
      t.scale = 1.0f;
      break;
    case F::expert_w1_packed:
    case F::expert_w2_packed:
    case F::expert_w3_packed:
      t.fill = Fill::mxfp4_packed;
      break;
    case F::expert_w1_scale:
    case F::expert_w3_scale:
      t.fill = Fill::mxfp4_scale;
      t.center = scale_center(uint64_t(c.latent));  // gate / up read the latent
      break;
    case F::expert_w2_scale:
      t.fill = Fill::mxfp4_scale;
      t.center = scale_center(uint64_t(c.moe_inter));  // down reads the expert's inner width
      break;
    default:
      t.scale = static_cast<float>(1.0 / std::sqrt(double(fan_in)));
  }
  return t;
}

// One layer: its trunk tensors, then its experts (MXFP4, as released); in data order.
std::vector<SynthTensor> layer_tensors(const io::ModelConfig& c, int l) {
  std::vector<SynthTensor> t;
  for (io::ReleasedTensor& r : io::released_layer_trunk(c, l))
    t.push_back(synth_tensor(c, std::move(r), l, -1));
  if (!c.is_dense(l))
    for (int e = 0; e < c.n_experts; ++e)
      for (io::ReleasedTensor& r : io::released_expert(c, l, e, io::ExpertFormat::mxfp4))
        t.push_back(synth_tensor(c, std::move(r), l, e));
  sort_data_order(t);
  return t;
}

std::vector<SynthTensor> model_level_tensors(const io::ModelConfig& c) {
  std::vector<SynthTensor> t;
  for (io::ReleasedTensor& r : io::released_model_tensors(c))
    t.push_back(synth_tensor(c, std::move(r), -1, -1));
  sort_data_order(t);
  return t;
}

uint64_t bytes_of(const std::vector<SynthTensor>& v) {
  uint64_t n = 0;
  for (const SynthTensor& t : v) n += t.entry.nbytes();
  return n;
}

}  // namespace

uint64_t SynthShard::data_bytes() const {
  return bytes_of(tensors);
}

size_t SynthCheckpoint::tensor_count() const {
  size_t n = 0;
  for (const SynthShard& s : shards) n += s.tensors.size();
  return n;
}

uint64_t SynthCheckpoint::data_bytes() const {
  uint64_t n = 0;
  for (const SynthShard& s : shards) n += s.data_bytes();
  return n;
}

std::string shard_file_name(int index, int count) {
  return fmt::format("model-{:05d}-of-{:06d}.safetensors", index + 1, count);
}

io::ModelConfig real_dims() {
  io::ModelConfig c = base_dims();
  c.hidden = 7168;
  c.n_layers = 93;
  c.vocab = 163840;
  c.kda_heads = 96;
  c.kda_head_dim = 128;
  c.mla_heads = 96;
  c.q_lora_rank = 1536;
  c.kv_lora_rank = 512;
  c.qk_nope = 128;
  c.qk_rope = 64;
  c.v_head = 128;
  c.n_experts = 896;
  c.top_k = 16;
  c.n_shared = 2;
  c.latent = 3584;
  c.moe_inter = 3072;
  c.dense_inter = 33792;
  c.attn_res_block = 12;
  c.full_attn_layers = default_full_attn(93);
  return c;
}

io::ModelConfig preset_dims(std::string_view name) {
  for (const Preset& p : kPresets) {
    if (name != p.name) continue;
    io::ModelConfig c = base_dims();
    c.hidden = p.hidden;
    c.n_layers = p.layers;
    c.vocab = p.vocab;
    c.kda_heads = p.heads;
    c.kda_head_dim = p.head_dim;
    c.mla_heads = p.mla_heads;
    c.q_lora_rank = p.q_lora;
    c.kv_lora_rank = p.kv_lora;
    c.qk_nope = p.qk_nope;
    c.qk_rope = p.qk_rope;
    c.v_head = p.v_head;
    c.n_experts = p.experts;
    c.top_k = p.top_k;
    c.n_shared = p.shared;
    c.latent = p.latent;
    c.moe_inter = p.moe_inter;
    c.dense_inter = p.dense_inter;
    c.attn_res_block = p.block;
    c.full_attn_layers = default_full_attn(p.layers);
    return c;
  }
  refuse("--size", fmt::format("must be one of tiny, small, medium, large (got '{}')", name));
}

std::vector<int> default_full_attn(int n_layers) {
  std::vector<int> v;
  for (int l = 4; l < n_layers; l += 4) v.push_back(l);
  v.push_back(n_layers);
  return v;
}

void validate_dims(const io::ModelConfig& c) {
  constexpr long kDim = 1 << 20;
  positive("--layers", c.n_layers, 4096);
  positive("--hidden", c.hidden, kDim);
  positive("--vocab", c.vocab, 1 << 24);
  positive("--heads", c.kda_heads, 4096);
  positive("--head-dim", c.kda_head_dim, 4096);
  positive("--conv-kernel", c.conv_kernel, 64);
  positive("--mla-heads", c.mla_heads, 4096);
  positive("--q-lora", c.q_lora_rank, kDim);
  positive("--kv-lora", c.kv_lora_rank, kDim);
  positive("--qk-nope", c.qk_nope, 4096);
  positive("--qk-rope", c.qk_rope, 4096);
  positive("--v-head", c.v_head, 4096);
  positive("--experts", c.n_experts, 1 << 16);
  positive("--top-k", c.top_k, io::kMaxTopK);
  positive("--shared", c.n_shared, 64);
  positive("--latent", c.latent, kDim);
  positive("--moe-inter", c.moe_inter, kDim);
  positive("--dense-inter", c.dense_inter, kDim);
  positive("--block-size", c.attn_res_block, 4096);
  if (c.top_k > c.n_experts)
    refuse("--top-k", fmt::format("selects {} of {} experts (--experts)", c.top_k, c.n_experts));
  if (c.kda_heads > c.kda_head_dim)
    refuse("--heads",
           fmt::format("({}) must not exceed --head-dim ({}): A_log holds head-dim values, one per head",
                       c.kda_heads, c.kda_head_dim));
  if (c.latent % kMxfp4Group)
    refuse("--latent",
           fmt::format("must be a multiple of {} (the MXFP4 group) (got {})", kMxfp4Group, c.latent));
  if (c.moe_inter % kMxfp4Group)
    refuse("--moe-inter",
           fmt::format("must be a multiple of {} (the MXFP4 group) (got {})", kMxfp4Group, c.moe_inter));
  if (c.first_dense < 0 || c.first_dense > c.n_layers)
    refuse("--first-dense", fmt::format("must be in 0..{} (--layers) (got {})", c.n_layers, c.first_dense));
  if (c.full_attn_layers.empty()) refuse("--full-attn", "must name at least one layer");
  std::set<int> seen;
  for (int l : c.full_attn_layers) {
    if (l < 1 || l > c.n_layers)
      refuse("--full-attn", fmt::format("entry {} is outside 1..{} (the list is ONE-based)", l, c.n_layers));
    if (!seen.insert(l).second) refuse("--full-attn", fmt::format("names layer {} twice", l));
  }
  if (static_cast<int>(seen.size()) >= c.n_layers)
    refuse("--full-attn", fmt::format("marks all {} layers as MLA, leaving no KDA layer", c.n_layers));
}

SynthCheckpoint layout_dense(const io::ModelConfig& c, int shards) {
  validate_dims(c);
  std::vector<std::vector<SynthTensor>> units;
  units.reserve(size_t(c.n_layers) + 1);
  for (int l = 0; l < c.n_layers; ++l) units.push_back(layer_tensors(c, l));
  units.push_back(model_level_tensors(c));
  const int U = static_cast<int>(units.size());
  if (shards < 0 || shards > U)
    refuse("--shards",
           fmt::format("must be in 1..{} (whole layers per shard, plus the head) (got {})", U, shards));
  const int N = shards == 0 ? U : shards;

  // Contiguous groups of whole units, balanced by bytes, none empty.
  std::vector<int> group(U);
  uint64_t total = 0;
  for (const auto& u : units) total += bytes_of(u);
  uint64_t before = 0;
  for (int i = 0, prev = 0; i < U; ++i) {
    const uint64_t mid = before + bytes_of(units[i]) / 2;
    int g = total ? static_cast<int>(static_cast<long double>(mid) * N / total) : i;
    const int lo = std::max(prev, N - (U - i)), hi = i == 0 ? 0 : std::min(prev + 1, N - 1);
    g = std::clamp(g, lo, std::max(lo, hi));
    group[i] = prev = g;
    before += bytes_of(units[i]);
  }

  SynthCheckpoint plan;
  plan.config = c;
  plan.shards.resize(N);
  for (int s = 0; s < N; ++s) plan.shards[s].file = shard_file_name(s, N);
  for (int i = 0; i < U; ++i) {
    auto& dst = plan.shards[group[i]].tensors;
    dst.insert(dst.end(), std::make_move_iterator(units[i].begin()), std::make_move_iterator(units[i].end()));
  }
  return plan;
}

}  // namespace k3::io::synth
