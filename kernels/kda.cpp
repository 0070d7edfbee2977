#include "kernels/kda.hpp"

#include <cmath>

#include "kernels/activations.hpp"
#include "kernels/dispatch.hpp"
#include "kernels/kda_bodies.hpp"

namespace k3::kernels {

void kda_decay(std::span<const float> z, std::span<const float> a_log, std::span<const float> dt_bias,
               size_t heads, size_t head_dim, float lower_bound, std::span<float> g, std::span<float> alpha) {
  for (size_t h = 0; h < heads; ++h) {
    const float a = ::expf(a_log[h]);  // A_log is per HEAD: only its first `heads` values are used
    for (size_t d = 0; d < head_dim; ++d) {
      const size_t i = h * head_dim + d;
      const float u = a * (z[i] + dt_bias[i]);
      const float gi = lower_bound * sigmoid(u);
      if (!g.empty()) g[i] = gi;
      alpha[i] = ::expf(gi);
    }
  }
}

float kda_q_scale(size_t head_dim) {
  return 1.0f / ::sqrtf(static_cast<float>(head_dim));
}

void kda_step(std::span<float> S, std::span<const float> alpha, std::span<const float> k,
              std::span<const float> v, float beta, std::span<const float> q_scaled, std::span<float> o,
              size_t head_dim) {
  const Isa isa = active_isa();
  count_body_run(Kernel::kda_step, isa);
  switch (isa) {
    case Isa::avx512:
      detail::kda_step_avx512(S.data(), alpha.data(), k.data(), v.data(), beta, q_scaled.data(), o.data(),
                              head_dim);
      return;
    case Isa::avx2:
      detail::kda_step_avx2(S.data(), alpha.data(), k.data(), v.data(), beta, q_scaled.data(), o.data(),
                            head_dim);
      return;
    case Isa::scalar:
      break;
  }
  detail::kda_step_scalar(S.data(), alpha.data(), k.data(), v.data(), beta, q_scaled.data(), o.data(),
                          head_dim);
}

namespace detail {

namespace {

// Columns [0, W) of the strip that starts at S, v and o (rows D apart in S). The reference order,
// vectorisable across j only: every S[i][j] and u_j / o_j sees the same f32 operations in the same
// i order whatever the vector width.
void strip_scalar(float* S, const float* alpha, const float* k, const float* v, float beta, const float* q,
                  float* o, size_t D, size_t W) {
  float u[kKdaStrip];
  for (size_t i = 0; i < D; ++i) {
    float* row = S + i * D;
    for (size_t j = 0; j < W; ++j) row[j] = row[j] * alpha[i];
  }
  for (size_t j = 0; j < W; ++j) u[j] = 0.0f;
  for (size_t i = 0; i < D; ++i) {
    if (k[i] == 0.0f) continue;  // skipped, not multiplied: 0 * inf would poison u
    const float* row = S + i * D;
    for (size_t j = 0; j < W; ++j) u[j] = u[j] + k[i] * row[j];
  }
  for (size_t i = 0; i < D; ++i) {
    if (k[i] == 0.0f) continue;
    const float kb = k[i] * beta;
    float* row = S + i * D;
    for (size_t j = 0; j < W; ++j) row[j] = row[j] + kb * (v[j] - u[j]);
  }
  for (size_t j = 0; j < W; ++j) o[j] = 0.0f;
  for (size_t i = 0; i < D; ++i) {
    if (q[i] == 0.0f) continue;
    const float* row = S + i * D;
    for (size_t j = 0; j < W; ++j) o[j] = o[j] + q[i] * row[j];
  }
}

}  // namespace

void kda_step_scalar(float* S, const float* alpha, const float* k, const float* v, float beta, const float* q,
                     float* o, size_t D) {
  for (size_t j0 = 0; j0 < D; j0 += kKdaStrip)
    strip_scalar(S + j0, alpha, k, v + j0, beta, q, o + j0, D, D - j0 < kKdaStrip ? D - j0 : kKdaStrip);
}

}  // namespace detail

}  // namespace k3::kernels
