// Model-level stages: the embedding gather and the output head (docs/model.md §3.2).
#pragma once
#include <cstddef>
#include <cstdint>
#include <span>

#include "io/config.hpp"
#include "stages/bind.hpp"

namespace k3::stages {

// out[t] = embed[ids[t]], bf16 rows widened exactly. Ids must be < vocab (checked by the caller).
void embed_tokens(const HeadWeights&, const io::ModelConfig&, std::span<const int32_t> ids,
                  std::span<float> out);

// logits[i] = lm_head * RMSNorm(h[i]; norm.weight) for n rows of h (already aggregated by the
// model-level AttnRes). scratch: n*hidden floats.
void lm_head(const HeadWeights&, const io::ModelConfig&, std::span<const float> h, size_t n,
             std::span<float> logits, std::span<float> scratch);

// Greedy: first index of the maximum.
int32_t greedy(std::span<const float> logits);

}  // namespace k3::stages
