// RMSNorm and L2Norm (docs/model.md §5.2): sequential f64 sum of squares, inverse rounded to f32 once.
#pragma once
#include <span>

namespace k3::kernels {

// rd32(1 / sqrt(sum(x^2)/n + f64(eps)))
float rms_inverse(std::span<const float> x, float eps);
// y_i = (w_i * x_i) * inv  (f32 ops). y may alias x.
void rmsnorm(std::span<const float> x, std::span<const float> w, float eps, std::span<float> y);
void rmsnorm_inplace(std::span<float> x, std::span<const float> w, float eps);
// x_i *= rd32(1 / sqrt(sum(x^2) + f64(1e-6f)))  -- sum, not mean.
void l2norm_inplace(std::span<float> x);

}  // namespace k3::kernels
