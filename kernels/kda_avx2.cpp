// KDA step, AVX2: 8 value channels j per vector, f32 multiply and add kept separate (no FMA), so
// each lane performs exactly the scalar body's operations; the j tail runs the same ops scalar.
#include <immintrin.h>

#include "kernels/kda_bodies.hpp"

namespace k3::kernels::detail {

namespace {

// Columns [0, W) of the strip that starts at S, v and o (rows D apart in S).
void strip_avx2(float* S, const float* alpha, const float* k, const float* v, float beta, const float* q,
                float* o, size_t D, size_t W) {
  alignas(32) float diff[kKdaStrip];
  alignas(32) float acc[kKdaStrip];
  const size_t full = W / 8 * 8;
  for (size_t i = 0; i < D; ++i) {
    float* row = S + i * D;
    const __m256 a = _mm256_set1_ps(alpha[i]);
    size_t j = 0;
    for (; j < full; j += 8) _mm256_storeu_ps(row + j, _mm256_mul_ps(_mm256_loadu_ps(row + j), a));
    for (; j < W; ++j) row[j] = row[j] * alpha[i];
  }
  for (size_t j = 0; j < W; ++j) acc[j] = 0.0f;
  for (size_t i = 0; i < D; ++i) {
    if (k[i] == 0.0f) continue;  // rows with k_i == 0 (either sign) are skipped
    const float* row = S + i * D;
    const __m256 ki = _mm256_set1_ps(k[i]);
    size_t j = 0;
    for (; j < full; j += 8) {
      const __m256 p = _mm256_mul_ps(ki, _mm256_loadu_ps(row + j));
      _mm256_storeu_ps(acc + j, _mm256_add_ps(_mm256_loadu_ps(acc + j), p));
    }
    for (; j < W; ++j) acc[j] = acc[j] + k[i] * row[j];
  }
  for (size_t j = 0; j < W; ++j) diff[j] = v[j] - acc[j];
  for (size_t i = 0; i < D; ++i) {
    if (k[i] == 0.0f) continue;
    float* row = S + i * D;
    const float kbs = k[i] * beta;
    const __m256 kb = _mm256_set1_ps(kbs);
    size_t j = 0;
    for (; j < full; j += 8) {
      const __m256 p = _mm256_mul_ps(kb, _mm256_loadu_ps(diff + j));
      _mm256_storeu_ps(row + j, _mm256_add_ps(_mm256_loadu_ps(row + j), p));
    }
    for (; j < W; ++j) row[j] = row[j] + kbs * diff[j];
  }
  for (size_t j = 0; j < W; ++j) acc[j] = 0.0f;
  for (size_t i = 0; i < D; ++i) {
    if (q[i] == 0.0f) continue;
    const float* row = S + i * D;
    const __m256 qi = _mm256_set1_ps(q[i]);
    size_t j = 0;
    for (; j < full; j += 8) {
      const __m256 p = _mm256_mul_ps(qi, _mm256_loadu_ps(row + j));
      _mm256_storeu_ps(acc + j, _mm256_add_ps(_mm256_loadu_ps(acc + j), p));
    }
    for (; j < W; ++j) acc[j] = acc[j] + q[i] * row[j];
  }
  for (size_t j = 0; j < W; ++j) o[j] = acc[j];
}

}  // namespace

void kda_step_avx2(float* S, const float* alpha, const float* k, const float* v, float beta, const float* q,
                   float* o, size_t D) {
  for (size_t j0 = 0; j0 < D; j0 += kKdaStrip)
    strip_avx2(S + j0, alpha, k, v + j0, beta, q, o + j0, D, D - j0 < kKdaStrip ? D - j0 : kKdaStrip);
}

}  // namespace k3::kernels::detail
