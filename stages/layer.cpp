#include "stages/layer.hpp"

#include <algorithm>

#include "kernels/activations.hpp"
#include "kernels/norms.hpp"
#include "stages/scratch.hpp"

namespace k3::stages {

size_t layer_attention_scratch(const io::ModelConfig& c, size_t T, size_t cached) {
  const size_t E = static_cast<size_t>(c.hidden);
  const size_t inner = std::max({attnres_scratch(c, static_cast<size_t>(c.max_blocks())),
                                 attention_kda_scratch(c, T), attention_mla_scratch(c, T, cached)});
  return 2 * T * E + inner;
}

size_t decoder_layer_scratch(const io::ModelConfig& c, size_t T, size_t cached) {
  const size_t E = static_cast<size_t>(c.hidden);
  return 2 * T * E +
         std::max({layer_attention_scratch(c, T, cached), moe_scratch(c, T), dense_scratch(c, T)});
}

void layer_attention(const LayerWeights& w, const io::ModelConfig& c, std::span<float> P, size_t T,
                     BlockStack& B, LayerState st, std::span<float> x, std::span<float> scratch) {
  const size_t E = static_cast<size_t>(c.hidden);
  Carver cut(scratch);
  std::span<float> h = cut.take(T * E), a = cut.take(T * E);
  std::span<float> inner = cut.take(layer_attention_scratch(c, T, st.cached) - 2 * T * E);
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
  if (const auto* kda = std::get_if<KdaWeights>(&w.attn)) {
    attention_kda(*kda, c, x, T, st.kda, a, inner);
  } else {
    attention_mla(std::get<MlaWeights>(w.attn), c, x, T, st.cached, st.mla, a, inner);
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

void layer_ffn_add(std::span<float> P, std::span<const float> ffn_out) {
  kernels::add_inplace(P.first(ffn_out.size()), ffn_out);
}

void decoder_layer(const LayerWeights& w, const ExpertFn& expert, const io::ModelConfig& c,
                   std::span<float> P, size_t T, BlockStack& B, LayerState st, std::span<float> scratch) {
  const size_t E = static_cast<size_t>(c.hidden);
  Carver cut(scratch);
  std::span<float> x = cut.take(T * E), a = cut.take(T * E);
  std::span<float> inner = cut.take(decoder_layer_scratch(c, T, st.cached) - 2 * T * E);
  P = P.first(T * E);

  layer_attention(w, c, P, T, B, st, x, inner);
  if (const auto* dense = std::get_if<DenseFfnWeights>(&w.ffn)) {
    dense_ffn(*dense, c, x, T, a, inner);
  } else {
    moe_forward(std::get<MoeWeights>(w.ffn), expert, c, x, T, a, inner);
  }
  layer_ffn_add(P, a);
}

}  // namespace k3::stages
