// Gated MLA (NoPE), one layer over T new tokens at positions cached..cached+T-1 (docs/model.md §3.6).
// The input is already input-normed. No rotary embedding is ever applied, but the qk_rope dims
// stay: the query keeps its per-head rope part and the key's rope part is ONE vector per position
// shared by all heads.
//
// Split for batched passes: q_a (+ its norm), q_b, kv_a (+ the latent norm), kv_b, g and o are
// row-wise, so they run ONCE over all T rows of the pass (one kernels::matmul each; a row's dot
// products are exactly those of a one-row matvec). Only what touches a sequence's cache runs per
// segment: its new kv/rope rows go to its own cache at its own positions, and attention reads it.
#pragma once
#include <cstddef>
#include <span>

#include "io/config.hpp"
#include "stages/bind.hpp"

namespace k3::stages {

// Per MLA layer: the EXPANDED [k_nope, v] of every head per position (not the latent) and the
// shared rope row per position. Rows 0..cached-1 hold earlier tokens; new rows are written here.
struct MlaCache {
  std::span<float> kv;    // [capacity][heads][qk_nope + v_head]
  std::span<float> rope;  // [capacity][qk_rope]
  size_t capacity = 0;
};

size_t mla_kv_floats_per_position(const io::ModelConfig&);    // heads*(qk_nope+v_head): K3ST `kvpp`
size_t mla_rope_floats_per_position(const io::ModelConfig&);  // qk_rope: K3ST `ropepp`

// One sequence's rows [first_row, first_row + rows) of a pass over several: its cache, holding
// `cached` earlier positions.
struct MlaSegment {
  MlaCache cache;
  size_t cached = 0;
  size_t first_row = 0, rows = 0;
};

// Exact for one segment; for several, attention_mla_scratch(T, cached) with T = all rows and
// cached + T >= every segment's cached + rows is enough (the segments' scratch is
// attention_mla_scratch(segs)).
size_t attention_mla_scratch(const io::ModelConfig&, size_t T, size_t cached);
size_t attention_mla_scratch(const io::ModelConfig&, std::span<const MlaSegment>);

// x, out: [T][hidden]. Causal over all cached + new positions. Throws io::Error (runtime) if
// cached + T exceeds the cache capacity.
void attention_mla(const MlaWeights&, const io::ModelConfig&, std::span<const float> x, size_t T,
                   size_t cached, MlaCache cache, std::span<float> out, std::span<float> scratch);
// Several sequences' rows in one pass (segments in row order, covering 0..T-1, distinct caches):
// each segment's output rows and cache rows are the bits attention_mla gives it alone. Every
// segment's capacity is checked before anything is written.
void attention_mla(const MlaWeights&, const io::ModelConfig&, std::span<const float> x, size_t T,
                   std::span<const MlaSegment>, std::span<float> out, std::span<float> scratch);

}  // namespace k3::stages
