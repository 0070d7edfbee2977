// KDA attention, one layer over T new tokens (docs/model.md §3.5). The input is already input-normed.
#pragma once
#include <cstddef>
#include <span>

#include "io/config.hpp"
#include "stages/bind.hpp"

namespace k3::stages {

// Carried per-layer state: S[h][i][j] (H*D*D, row = key channel) then the ShortConv histories of
// q, k, v, each [P][K-1] raw inputs, oldest first. Zero = fresh sequence.
struct KdaState {
  std::span<float> S;
  std::span<float> conv;
};

size_t kda_state_floats(const io::ModelConfig&);  // H*D*D + 3*P*(K-1): the K3ST `kper`
KdaState kda_state_view(const io::ModelConfig&, std::span<float> layer_state);

size_t attention_kda_scratch(const io::ModelConfig&, size_t T);

// x, out: [T][hidden]. The recurrence runs t = 0..T-1 in order; state carries across calls.
void attention_kda(const KdaWeights&, const io::ModelConfig&, std::span<const float> x, size_t T,
                   KdaState state, std::span<float> out, std::span<float> scratch);

}  // namespace k3::stages
