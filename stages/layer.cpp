#include "stages/layer.hpp"

#include <algorithm>
#include <vector>

#include "io/error.hpp"
#include "kernels/activations.hpp"
#include "kernels/norms.hpp"
#include "stages/scratch.hpp"

namespace k3::stages {

namespace {

size_t rows_of(std::span<const LayerSegment> segs) {
  size_t T = 0;
  for (const LayerSegment& s : segs) T += s.rows;
  return T;
}

// The attention's own scratch. Its row-wise parts cover all T rows of the pass; MLA's attention
// runs per segment, one after another, so only the longest segment's scores count.
size_t attention_inner(const io::ModelConfig& c, std::span<const LayerSegment> segs) {
  std::vector<MlaSegment> mla(segs.size());
  for (size_t i = 0; i < segs.size(); ++i) {
    mla[i].cached = segs[i].state.cached;
    mla[i].rows = segs[i].rows;
  }
  return std::max({attnres_scratch(c, static_cast<size_t>(c.max_blocks())),
                   attention_kda_scratch(c, rows_of(segs)), attention_mla_scratch(c, mla)});
}

}  // namespace

size_t layer_attention_scratch(const io::ModelConfig& c, std::span<const LayerSegment> segs) {
  return 2 * rows_of(segs) * static_cast<size_t>(c.hidden) + attention_inner(c, segs);
}

size_t layer_attention_scratch(const io::ModelConfig& c, size_t T, size_t cached) {
  LayerSegment one;
  one.state.cached = cached;
  one.rows = T;
  return layer_attention_scratch(c, std::span(&one, 1));
}

size_t decoder_layer_scratch(const io::ModelConfig& c, std::span<const LayerSegment> segs) {
  const size_t E = static_cast<size_t>(c.hidden), T = rows_of(segs);
  return 2 * T * E + std::max({layer_attention_scratch(c, segs), moe_scratch(c, T), dense_scratch(c, T)});
}

size_t decoder_layer_scratch(const io::ModelConfig& c, size_t T, size_t cached) {
  LayerSegment one;
  one.state.cached = cached;
  one.rows = T;
  return decoder_layer_scratch(c, std::span(&one, 1));
}

void layer_attention(const LayerWeights& w, const io::ModelConfig& c, std::span<float> P, size_t T,
                     BlockStack& B, std::span<const LayerSegment> segs, std::span<float> x,
                     std::span<float> scratch) {
  const size_t E = static_cast<size_t>(c.hidden);
  if (rows_of(segs) != T)
    throw io::runtime_error("layer: segments do not cover the pass's rows (internal error)");
  Carver cut(scratch);
  std::span<float> h = cut.take(T * E), a = cut.take(T * E);
  std::span<float> inner = cut.take(attention_inner(c, segs));
  P = P.first(T * E);
  x = x.first(T * E);

  // Pre-attention aggregation only when the stack is non-empty; it still sees the old P as its
  // last source on a boundary layer (the push comes after it).
  if (B.size() > 0) {
    attnres_stage(B, P, w.attn_res_norm, w.attn_res_proj, c, 0, T, h, inner);
  } else {
    std::copy(P.begin(), P.end(), h.begin());
  }
  bool prefix_cleared = false;
  if (w.kind.attn_res_boundary) {
    B.push(P);
    prefix_cleared = true;
  }

  for (size_t t = 0; t < T; ++t)
    kernels::rmsnorm(h.subspan(t * E, E), w.input_norm, c.rms_eps, x.subspan(t * E, E));
  // Attention over all rows at once: its projections run once for the whole pass; only the
  // recurrence (KDA) / the attention over the cache (MLA) runs per segment, on its own state.
  if (const auto* kda = std::get_if<KdaWeights>(&w.attn)) {
    std::vector<KdaSegment> ks(segs.size());
    for (size_t i = 0; i < segs.size(); ++i)
      ks[i] = {.state = segs[i].state.kda, .first_row = segs[i].first_row, .rows = segs[i].rows};
    attention_kda(*kda, c, x, T, ks, a, inner);
  } else {
    std::vector<MlaSegment> ms(segs.size());
    for (size_t i = 0; i < segs.size(); ++i)
      ms[i] = {.cache = segs[i].state.mla,
               .cached = segs[i].state.cached,
               .first_row = segs[i].first_row,
               .rows = segs[i].rows};
    attention_mla(std::get<MlaWeights>(w.attn), c, x, T, ms, a, inner);
  }
  if (prefix_cleared) {
    std::copy(a.begin(), a.end(), P.begin());
  } else {
    kernels::add_inplace(P, a);
  }

  attnres_stage(B, P, w.mlp_res_norm, w.mlp_res_proj, c, 0, T, h, inner);
  for (size_t t = 0; t < T; ++t)
    kernels::rmsnorm(h.subspan(t * E, E), w.post_attn_norm, c.rms_eps, x.subspan(t * E, E));
}

void layer_attention(const LayerWeights& w, const io::ModelConfig& c, std::span<float> P, size_t T,
                     BlockStack& B, LayerState st, std::span<float> x, std::span<float> scratch) {
  const LayerSegment one{.state = st, .first_row = 0, .rows = T};
  layer_attention(w, c, P, T, B, std::span(&one, 1), x, scratch);
}

void layer_ffn_add(std::span<float> P, std::span<const float> ffn_out) {
  kernels::add_inplace(P.first(ffn_out.size()), ffn_out);
}

void decoder_layer(const LayerWeights& w, const ExpertFn& expert, const io::ModelConfig& c,
                   std::span<float> P, size_t T, BlockStack& B, std::span<const LayerSegment> segs,
                   std::span<float> scratch) {
  const size_t E = static_cast<size_t>(c.hidden);
  Carver cut(scratch);
  std::span<float> x = cut.take(T * E), a = cut.take(T * E);
  std::span<float> inner = cut.take(decoder_layer_scratch(c, segs) - 2 * T * E);
  P = P.first(T * E);

  layer_attention(w, c, P, T, B, segs, x, inner);
  if (const auto* dense = std::get_if<DenseFfnWeights>(&w.ffn)) {
    dense_ffn(*dense, c, x, T, a, inner);
  } else {
    moe_forward(std::get<MoeWeights>(w.ffn), expert, c, x, T, a, inner);
  }
  layer_ffn_add(P, a);
}

void decoder_layer(const LayerWeights& w, const ExpertFn& expert, const io::ModelConfig& c,
                   std::span<float> P, size_t T, BlockStack& B, LayerState st, std::span<float> scratch) {
  const LayerSegment one{.state = st, .first_row = 0, .rows = T};
  decoder_layer(w, expert, c, P, T, B, std::span(&one, 1), scratch);
}

}  // namespace k3::stages
