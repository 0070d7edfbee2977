#include "kernels/norms.hpp"

#include <cmath>
#include <cstddef>

namespace k3::kernels {

namespace {

// Sequential f64 sum from 0.0: vectorising it would regroup the additions and change bits.
double sum_squares(std::span<const float> x) {
  double ss = 0.0;
  for (float v : x) ss += static_cast<double>(v) * static_cast<double>(v);
  return ss;
}

}  // namespace

float rms_inverse(std::span<const float> x, float eps) {
  const double mean = sum_squares(x) / static_cast<double>(x.size());
  return static_cast<float>(1.0 / std::sqrt(mean + static_cast<double>(eps)));
}

void rmsnorm(std::span<const float> x, std::span<const float> w, float eps, std::span<float> y) {
  const float inv = rms_inverse(x, eps);  // before any write: y may alias x
  for (size_t i = 0; i < x.size(); ++i) y[i] = (w[i] * x[i]) * inv;
}

void rmsnorm_inplace(std::span<float> x, std::span<const float> w, float eps) {
  rmsnorm(x, w, eps, x);
}

void l2norm_inplace(std::span<float> x) {
  const float inv = static_cast<float>(1.0 / std::sqrt(sum_squares(x) + static_cast<double>(1e-6f)));
  for (float& v : x) v = v * inv;
}

}  // namespace k3::kernels
