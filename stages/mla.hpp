// Gated MLA (NoPE), one layer over T new tokens at positions cached..cached+T-1 (docs/model.md §3.6).
// The input is already input-normed. No rotary embedding is ever applied, but the qk_rope dims
// stay: the query keeps its per-head rope part and the key's rope part is ONE vector per position
// shared by all heads.
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

size_t attention_mla_scratch(const io::ModelConfig&, size_t T, size_t cached);

// x, out: [T][hidden]. Causal over all cached + new positions. Throws io::Error (runtime) if
// cached + T exceeds the cache capacity.
void attention_mla(const MlaWeights&, const io::ModelConfig&, std::span<const float> x, size_t T,
                   size_t cached, MlaCache cache, std::span<float> out, std::span<float> scratch);

}  // namespace k3::stages
