// One decoder layer with attention residuals (docs/model.md §3.3), composed from the stage functions:
//   P := h;  if |B| > 0: h := AttnRes(B ++ [P]; self_attention_res)
//   if l mod S == 0: B.push(P); P := NONE            (snapshot, then CLEAR)
//   a := Attention(RMSNorm(h; input_layernorm));  P := P is NONE ? a : P + a
//   h := AttnRes(B ++ [P]; mlp_res)                 (unconditional)
//   P := P + FFN(RMSNorm(h; post_attention_layernorm))
//
// Batched passes (one decode step over B sequences, or prefill chunks beside decode tokens): the
// pass's rows are the sequences' rows concatenated, and everything that is row-wise runs ONCE over
// all of them -- norms, AttnRes, the FFN / MoE, and inside the attention every projection (KDA:
// q, k, v, g, b, f_a, f_b, o; MLA: q_a, q_b, kv_a, kv_b, g, o), each one kernels::matmul over all
// rows, so a weight streams from memory once per step instead of once per sequence. Only what
// carries a sequence's state runs per segment: KDA's ShortConv history and recurrence
// (kda_recur), MLA's cache writes and the attention over that sequence's cache. matmul gives each
// row exactly the bits of a one-row matvec, and per-row operations keep their order, so a
// sequence's bits are those of its solo pass whoever shares the step.
#pragma once
#include <cstddef>
#include <span>

#include "io/config.hpp"
#include "stages/attnres.hpp"
#include "stages/bind.hpp"
#include "stages/kda.hpp"
#include "stages/mla.hpp"
#include "stages/moe.hpp"

namespace k3::stages {

// Where a layer's carried state lives: KDA state for KDA layers, the KV cache for MLA layers.
struct LayerState {
  KdaState kda;
  MlaCache mla;
  size_t cached = 0;  // positions already in the MLA cache (new tokens start here)
};

// One sequence's rows in a pass over several (a batched decode step): rows [first_row, first_row +
// rows) of the concatenated [T][hidden] activations belong to the sequence whose carried state is
// `state`. Everything in a layer is row-wise except the attention's recurrence / cache part, which
// runs per segment on its own state, so a row's bits never depend on which other segments share the pass.
// Segments are in row order, cover rows 0..T-1 without a gap, and name distinct states.
struct LayerSegment {
  LayerState state;
  size_t first_row = 0, rows = 0;
};

size_t decoder_layer_scratch(const io::ModelConfig&, size_t T, size_t cached);
size_t decoder_layer_scratch(const io::ModelConfig&, std::span<const LayerSegment>);

// prefix: [T][hidden], the layer's input on entry and its output P on return.
void decoder_layer(const LayerWeights&, const ExpertFn& expert, const io::ModelConfig&,
                   std::span<float> prefix, size_t T, BlockStack& blocks, LayerState state,
                   std::span<float> scratch);
// The same over several sequences' rows (T = the segments' rows together).
void decoder_layer(const LayerWeights&, const ExpertFn& expert, const io::ModelConfig&,
                   std::span<float> prefix, size_t T, BlockStack& blocks, std::span<const LayerSegment>,
                   std::span<float> scratch);

// decoder_layer in two halves, for a graph that schedules the FFN as nodes of its own:
//   layer_attention: the recipe above up to the FFN input; on return `prefix` holds P after the
//     attention add and x = RMSNorm(AttnRes(B ++ [P]; mlp_res); post_attention_layernorm), [T][hidden];
//   FFN(x) -> out (dense_ffn, or route / moe_latent / shared / expert_apply / moe_combine);
//   layer_ffn_add: P := P + out.
size_t layer_attention_scratch(const io::ModelConfig&, size_t T, size_t cached);
size_t layer_attention_scratch(const io::ModelConfig&, std::span<const LayerSegment>);
void layer_attention(const LayerWeights&, const io::ModelConfig&, std::span<float> prefix, size_t T,
                     BlockStack& blocks, LayerState state, std::span<float> x, std::span<float> scratch);
void layer_attention(const LayerWeights&, const io::ModelConfig&, std::span<float> prefix, size_t T,
                     BlockStack& blocks, std::span<const LayerSegment>, std::span<float> x,
                     std::span<float> scratch);
void layer_ffn_add(std::span<float> prefix, std::span<const float> ffn_out);

}  // namespace k3::stages
