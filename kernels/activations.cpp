#include "kernels/activations.hpp"

#include <cmath>
#include <cstddef>

namespace k3::kernels {

float sigmoid(float x) {
  return 1.0f / (1.0f + ::expf(-x));
}

float silu(float x) {
  return x * sigmoid(x);
}

void situ_glu(std::span<const float> gate, std::span<const float> up, float beta1, float beta2,
              std::span<float> y) {
  for (size_t i = 0; i < y.size(); ++i) {
    const float g = gate[i];
    // The sigmoid takes the uncapped gate; division by beta, not multiply by 1/beta (1/25 is inexact).
    const float a = (beta1 * ::tanhf(g / beta1)) * sigmoid(g);
    const float u = beta2 * ::tanhf(up[i] / beta2);
    y[i] = a * u;
  }
}

void sigmoid_gate_inplace(std::span<float> x, std::span<const float> g) {
  for (size_t i = 0; i < x.size(); ++i) x[i] = x[i] * sigmoid(g[i]);
}

void axpy(float p, std::span<const float> v, std::span<float> out) {
  for (size_t i = 0; i < out.size(); ++i) out[i] = out[i] + p * v[i];
}

void weighted_sum(std::span<const float> weights, std::span<const std::span<const float>> vectors,
                  std::span<float> out) {
  for (float& o : out) o = 0.0f;
  for (size_t j = 0; j < weights.size(); ++j) axpy(weights[j], vectors[j], out);
}

void add_inplace(std::span<float> a, std::span<const float> b) {
  for (size_t i = 0; i < a.size(); ++i) a[i] = a[i] + b[i];
}

}  // namespace k3::kernels
