// MLA scores and the shared softmax (docs/model.md §3.6, §5.2).
#pragma once
#include <span>

namespace k3::kernels {

// d = sequential f64 sum over q_nope.k_nope then q_rope.k_rope; returns rd32(d) * scale.
float mla_score(std::span<const float> q_nope, std::span<const float> k_nope, std::span<const float> q_rope,
                std::span<const float> k_rope, float scale);

enum class SoftmaxSeed { neg_inf, first };  // MLA seeds the max with -inf, AttnRes with score 0

// m = max (strict >); e_s = expf(s - m); Z = sequential f64 sum; p_s = rd32(e_s / Z).
void softmax(std::span<const float> scores, std::span<float> p, SoftmaxSeed seed);

}  // namespace k3::kernels
