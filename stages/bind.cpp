#include "stages/bind.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>

#include "io/error.hpp"
#include "io/widen.hpp"
#include "stages/moe.hpp"

namespace k3::stages {

namespace {

class Binder {
 public:
  // `dry`: only record the coded ranges; no byte is read, bytes and widen may be empty (coded_ranges).
  Binder(const Layout& lay, std::span<const std::byte> bytes, std::span<float> widen,
         const CodedLayer& coded = {}, bool dry = false)
      : lay_(lay), bytes_(bytes), widen_(widen), coded_(coded), dry_(dry) {
    if (dry) return;
    if (bytes.size() < lay.buffer_bytes)
      throw io::runtime_error(
          fmt::format("bind: {} bytes given, layout needs {}", bytes.size(), lay.buffer_bytes));
    if (widen.size() < lay.widen_floats)
      throw io::runtime_error(
          fmt::format("bind: widen area holds {} floats, layout needs {}", widen.size(), lay.widen_floats));
    if (reinterpret_cast<uintptr_t>(bytes.data()) % 8 != lay.base_mod8)
      throw io::runtime_error(
          fmt::format("bind: layer bytes must start at an address == {} (mod 8)", lay.base_mod8));
  }

  bool has(Field f) const { return find(f) >= 0; }

  // Small vector, widened exactly to f32; `keep` limits it to its first `keep` values.
  Vec vec(Field f, size_t keep = SIZE_MAX) {
    const int i = need(f);
    if (dry_) return {};
    const io::TensorInfo& t = lay_.places[i].info;
    const std::byte* src = bytes_.data() + lay_.places[i].offset;
    std::span<float> dst = take(t.numel());
    widen_into(t.dtype, src, dst);
    return Vec(dst).first(std::min<size_t>(keep, dst.size()));
  }

  Matrix mat(Field f, bool may_code = true) {
    const int i = need(f);
    const io::TensorInfo& t = lay_.places[i].info;
    const TensorSpec& s = lay_.specs[i];
    const size_t rows = s.shape[0], cols = s.numel() / s.shape[0];
    const uint64_t at = coded_.first_byte + lay_.places[i].offset;  // in the coded image
    if (may_code && coded_.src && t.dtype == io::DType::BF16 && at % 2 == 0) {
      if (coded_.coded) coded_.coded->emplace_back(at, at + t.nbytes);
      return kernels::CodedBf16Matrix{.src = coded_.src, .first = at / 2, .rows = rows, .cols = cols};
    }
    if (dry_) return kernels::F32Matrix{};
    const std::byte* src = bytes_.data() + lay_.places[i].offset;
    const bool aligned = reinterpret_cast<uintptr_t>(src) % io::dtype_size(t.dtype) == 0;
    if (t.dtype == io::DType::BF16 && aligned)
      return kernels::Bf16Matrix{{reinterpret_cast<const uint16_t*>(src), t.numel()}, rows, cols};
    if (t.dtype == io::DType::F32 && aligned)
      return kernels::F32Matrix{{reinterpret_cast<const float*>(src), t.numel()}, rows, cols};
    std::span<float> dst = take(t.numel());  // F16, or a misaligned F32 / BF16 tensor
    widen_into(t.dtype, src, dst);
    return kernels::F32Matrix{dst, rows, cols};
  }

  DenseMatrix dense(Field f) {
    Matrix m = mat(f, false);
    if (auto* a = std::get_if<kernels::F32Matrix>(&m)) return *a;
    return std::get<kernels::Bf16Matrix>(m);
  }

  kernels::Mxfp4Matrix mxfp4(Field packed, Field scale) {
    const int p = need(packed), s = need(scale);
    if (dry_) return {};
    const TensorSpec& ps = lay_.specs[p];
    const auto* pk = reinterpret_cast<const uint8_t*>(bytes_.data() + lay_.places[p].offset);
    const auto* sc = reinterpret_cast<const uint8_t*>(bytes_.data() + lay_.places[s].offset);
    return kernels::Mxfp4Matrix{
        {pk, lay_.places[p].info.nbytes}, {sc, lay_.places[s].info.nbytes}, ps.shape[0], ps.shape[1] * 2};
  }

 private:
  int find(Field f) const {
    for (size_t i = 0; i < lay_.specs.size(); ++i)
      if (lay_.specs[i].field == f) return static_cast<int>(i);
    return -1;
  }
  int need(Field f) const {
    const int i = find(f);
    if (i < 0) throw io::runtime_error(fmt::format("bind: layout has no {} tensor", field_name(f)));
    return i;
  }
  std::span<float> take(size_t n) {
    if (used_ + n > widen_.size()) throw io::runtime_error("bind: widen area exhausted");
    std::span<float> s = widen_.subspan(used_, n);
    used_ += n;
    return s;
  }
  // Exact widening (io/widen.hpp, tested on every F16 / BF16 bit pattern). A U8 tensor is packed
  // MXFP4 data or scales, never a vector or a dense matrix.
  static void widen_into(io::DType d, const std::byte* src, std::span<float> dst) {
    if (d == io::DType::U8) throw io::runtime_error("bind: cannot widen a U8 tensor");
    io::widen_to_f32(d, {src, dst.size() * io::dtype_size(d)}, dst);
  }

  const Layout& lay_;
  std::span<const std::byte> bytes_;
  std::span<float> widen_;
  CodedLayer coded_;
  bool dry_ = false;
  size_t used_ = 0;
};

}  // namespace

namespace {

LayerWeights bind_layer_with(Binder& b, const io::ModelConfig& c, int layer);

// A Bf16Source that is never read: coded_ranges binds with it.
struct NoSource final : kernels::Bf16Source {
  void decode_values(uint64_t, uint64_t, uint16_t*) const override {
    throw io::runtime_error("bind: coded_ranges' source was read (internal error)");
  }
};

}  // namespace

LayerWeights bind_layer(const io::ModelConfig& c, int layer, const Layout& lay,
                        std::span<const std::byte> bytes, std::span<float> widen, const CodedLayer& coded) {
  Binder b(lay, bytes, widen, coded);
  return bind_layer_with(b, c, layer);
}

std::vector<std::pair<uint64_t, uint64_t>> coded_ranges(const io::ModelConfig& c, int layer,
                                                        const Layout& lay, uint64_t first_byte) {
  static const NoSource none;
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  Binder b(lay, {}, {}, CodedLayer{.src = &none, .first_byte = first_byte, .coded = &ranges}, true);
  (void)bind_layer_with(b, c, layer);
  std::sort(ranges.begin(), ranges.end());
  return ranges;
}

namespace {

LayerWeights bind_layer_with(Binder& b, const io::ModelConfig& c, int layer) {
  LayerWeights w;
  w.layer = layer;
  w.kind = c.layer(layer);
  w.input_norm = b.vec(Field::input_norm);
  w.post_attn_norm = b.vec(Field::post_attn_norm);
  w.attn_res_norm = b.vec(Field::attn_res_norm);
  w.attn_res_proj = b.vec(Field::attn_res_proj);
  w.mlp_res_norm = b.vec(Field::mlp_res_norm);
  w.mlp_res_proj = b.vec(Field::mlp_res_proj);
  if (w.kind.attention == io::LayerAttention::kda) {
    KdaWeights a;
    a.q = b.mat(Field::kda_q);
    a.k = b.mat(Field::kda_k);
    a.v = b.mat(Field::kda_v);
    a.g = b.mat(Field::kda_g);
    a.o = b.mat(Field::kda_o);
    a.f_a = b.mat(Field::kda_f_a);
    a.f_b = b.mat(Field::kda_f_b);
    a.b = b.mat(Field::kda_b);
    a.q_conv = b.vec(Field::kda_q_conv);
    a.k_conv = b.vec(Field::kda_k_conv);
    a.v_conv = b.vec(Field::kda_v_conv);
    a.a_log = b.vec(Field::kda_a_log, static_cast<size_t>(c.kda_heads));  // per head: first H values
    a.dt_bias = b.vec(Field::kda_dt_bias);
    a.o_norm = b.vec(Field::kda_o_norm);
    w.attn = a;
  } else {
    MlaWeights a;
    a.q_a = b.mat(Field::mla_q_a);
    a.q_b = b.mat(Field::mla_q_b);
    a.kv_a = b.mat(Field::mla_kv_a);
    a.kv_b = b.mat(Field::mla_kv_b);
    a.o = b.mat(Field::mla_o);
    if (c.mla_out_gate) a.g = b.mat(Field::mla_g);
    a.q_a_norm = b.vec(Field::mla_q_a_norm);
    a.kv_a_norm = b.vec(Field::mla_kv_a_norm);
    w.attn = a;
  }
  if (w.kind.ffn == io::LayerFfn::dense) {
    w.ffn = DenseFfnWeights{b.mat(Field::dense_gate), b.mat(Field::dense_up), b.mat(Field::dense_down)};
  } else {
    MoeWeights m;
    m.router = b.dense(Field::moe_router);
    m.bias = b.vec(Field::moe_bias);
    m.norm = b.vec(Field::moe_norm);
    m.down = b.mat(Field::moe_down);
    m.up = b.mat(Field::moe_up);
    m.shared_gate = b.mat(Field::shared_gate);
    m.shared_up = b.mat(Field::shared_up);
    m.shared_down = b.mat(Field::shared_down);
    w.ffn = m;
  }
  return w;
}

}  // namespace

ExpertWeights bind_expert(const io::ModelConfig&, const Layout& lay, std::span<const std::byte> bytes,
                          std::span<float> widen) {
  Binder b(lay, bytes, widen);
  if (b.has(Field::expert_w1))
    return {b.mat(Field::expert_w1), b.mat(Field::expert_w2), b.mat(Field::expert_w3)};
  return {b.mxfp4(Field::expert_w1_packed, Field::expert_w1_scale),
          b.mxfp4(Field::expert_w2_packed, Field::expert_w2_scale),
          b.mxfp4(Field::expert_w3_packed, Field::expert_w3_scale)};
}

HeadWeights bind_head(const io::ModelConfig&, const Layout& lay, std::span<const std::byte> bytes,
                      std::span<float> widen) {
  Binder b(lay, bytes, widen);
  HeadWeights h;
  if (b.has(Field::embed)) h.embed = b.dense(Field::embed);  // else read by rows (EmbedRows)
  h.final_norm = b.vec(Field::final_norm);
  h.out_res_norm = b.vec(Field::out_res_norm);
  h.out_res_proj = b.vec(Field::out_res_proj);
  h.lm_head = b.mat(Field::lm_head);
  return h;
}

namespace {

// Reads a layout into a fresh buffer placed so that the layout's alignment rule holds.
template <class Piece>
std::span<const std::byte> read_piece(Piece& piece, const Layout& lay, const io::ShardSet& shards) {
  piece.bytes = io::AlignedBuffer(lay.buffer_bytes + lay.base_mod8 + 1);
  std::span<std::byte> dst = piece.bytes.bytes().subspan(lay.base_mod8, lay.buffer_bytes);
  read_layout(lay, shards, dst);
  piece.widen.assign(lay.widen_floats, 0.0f);
  return dst;
}

}  // namespace

const ExpertWeights& ResidentModel::expert(int l, int e) const {
  const Expert& x = layers_[l].experts[e];
  if (!x.held)
    throw io::runtime_error(
        fmt::format("layer {} expert {} is held by another process (expert parallel)", l, e));
  return x.w;
}

std::unique_ptr<ResidentModel> ResidentModel::load(const io::ShardSet& shards, const io::ModelConfig& c,
                                                   int n_layers, ExpertExchange* experts) {
  auto m = std::unique_ptr<ResidentModel>(new ResidentModel());
  m->cfg_ = c;
  const int n = (n_layers <= 0 || n_layers >= c.n_layers) ? c.n_layers : n_layers;

  // Locate everything before reading anything, so a missing tensor fails fast.
  Layout head_lay = locate(model_tensors(c), shards, c);
  std::vector<Layout> layer_lays;
  std::vector<std::vector<std::optional<Layout>>> expert_lays(n);
  for (int l = 0; l < n; ++l) {
    layer_lays.push_back(locate(layer_tensors(c, l).tensors, shards, c));
    if (!c.is_dense(l))
      for (int e = 0; e < c.n_experts; ++e)
        expert_lays[l].push_back(
            experts && !experts->owns(e) ? std::nullopt : std::optional(locate_expert(shards, c, l, e)));
  }

  std::span<const std::byte> hb = read_piece(m->head_.mem, head_lay, shards);
  m->head_.w = bind_head(c, head_lay, hb, m->head_.mem.widen);
  m->bytes_ += head_lay.buffer_bytes;
  m->layers_.resize(n);
  for (int l = 0; l < n; ++l) {
    Layer& L = m->layers_[l];
    std::span<const std::byte> lb = read_piece(L.mem, layer_lays[l], shards);
    L.w = bind_layer(c, l, layer_lays[l], lb, L.mem.widen);
    if (auto* moe = std::get_if<MoeWeights>(&L.w.ffn)) moe->exchange = experts;
    m->bytes_ += layer_lays[l].buffer_bytes;
    L.experts.resize(expert_lays[l].size());
    for (size_t e = 0; e < expert_lays[l].size(); ++e) {
      if (!expert_lays[l][e]) continue;  // another process's expert
      const Layout& lay = *expert_lays[l][e];
      Expert& X = L.experts[e];
      std::span<const std::byte> xb = read_piece(X.mem, lay, shards);
      X.w = bind_expert(c, lay, xb, X.mem.widen);
      X.held = true;
      m->bytes_ += lay.buffer_bytes;
    }
  }
  return m;
}

}  // namespace k3::stages
