#include "kernels/attention.hpp"

#include <cmath>
#include <cstddef>
#include <limits>

namespace k3::kernels {

float mla_score(std::span<const float> q_nope, std::span<const float> k_nope, std::span<const float> q_rope,
                std::span<const float> k_rope, float scale) {
  // One sequential f64 sum running through the NoPE part and on into the rope part.
  double d = 0.0;
  for (size_t i = 0; i < q_nope.size(); ++i)
    d += static_cast<double>(q_nope[i]) * static_cast<double>(k_nope[i]);
  for (size_t i = 0; i < q_rope.size(); ++i)
    d += static_cast<double>(q_rope[i]) * static_cast<double>(k_rope[i]);
  return static_cast<float>(d) * scale;
}

void softmax(std::span<const float> scores, std::span<float> p, SoftmaxSeed seed) {
  const size_t n = scores.size();
  if (n == 0) return;
  float m = seed == SoftmaxSeed::first ? scores[0] : -std::numeric_limits<float>::infinity();
  for (size_t s = seed == SoftmaxSeed::first ? 1 : 0; s < n; ++s) {
    if (scores[s] > m) m = scores[s];
  }
  double z = 0.0;
  for (size_t s = 0; s < n; ++s) {
    p[s] = ::expf(scores[s] - m);  // e_s is stored as f32 before it enters the f64 sum
    z += static_cast<double>(p[s]);
  }
  for (size_t s = 0; s < n; ++s) p[s] = static_cast<float>(static_cast<double>(p[s]) / z);
}

}  // namespace k3::kernels
