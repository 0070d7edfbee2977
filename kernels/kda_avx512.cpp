// KDA step, AVX-512: 16 value channels j per vector, f32 multiply and add kept separate (no FMA),
// so each lane performs exactly the scalar body's operations.
#include <immintrin.h>

#include "kernels/kda_bodies.hpp"

namespace k3::kernels::detail {

namespace {

__mmask16 tail_mask(size_t n) {
  return static_cast<__mmask16>((1u << n) - 1u);
}

// Columns [0, W) of the strip that starts at S, v and o (rows D apart in S).
void strip_avx512(float* S, const float* alpha, const float* k, const float* v, float beta, const float* q,
                  float* o, size_t D, size_t W) {
  alignas(64) float diff[kKdaStrip];
  alignas(64) float acc[kKdaStrip];
  const size_t full = W / 16 * 16;
  const __mmask16 tm = tail_mask(W - full);
  for (size_t i = 0; i < D; ++i) {
    float* row = S + i * D;
    const __m512 a = _mm512_set1_ps(alpha[i]);
    size_t j = 0;
    for (; j < full; j += 16) _mm512_storeu_ps(row + j, _mm512_mul_ps(_mm512_loadu_ps(row + j), a));
    if (tm) _mm512_mask_storeu_ps(row + j, tm, _mm512_mul_ps(_mm512_maskz_loadu_ps(tm, row + j), a));
  }
  // (b) u = S^T k over the decayed state, rows with k_i == 0 (either sign) skipped.
  for (size_t j = 0; j < W; ++j) acc[j] = 0.0f;
  for (size_t i = 0; i < D; ++i) {
    if (k[i] == 0.0f) continue;
    const float* row = S + i * D;
    const __m512 ki = _mm512_set1_ps(k[i]);
    size_t j = 0;
    for (; j < full; j += 16) {
      const __m512 p = _mm512_mul_ps(ki, _mm512_loadu_ps(row + j));
      _mm512_storeu_ps(acc + j, _mm512_add_ps(_mm512_loadu_ps(acc + j), p));
    }
    if (tm) {
      const __m512 p = _mm512_mul_ps(ki, _mm512_maskz_loadu_ps(tm, row + j));
      _mm512_mask_storeu_ps(acc + j, tm, _mm512_add_ps(_mm512_maskz_loadu_ps(tm, acc + j), p));
    }
  }
  for (size_t j = 0; j < W; ++j) diff[j] = v[j] - acc[j];
  // (c) delta write.
  for (size_t i = 0; i < D; ++i) {
    if (k[i] == 0.0f) continue;
    float* row = S + i * D;
    const __m512 kb = _mm512_set1_ps(k[i] * beta);
    size_t j = 0;
    for (; j < full; j += 16) {
      const __m512 p = _mm512_mul_ps(kb, _mm512_loadu_ps(diff + j));
      _mm512_storeu_ps(row + j, _mm512_add_ps(_mm512_loadu_ps(row + j), p));
    }
    if (tm) {
      const __m512 p = _mm512_mul_ps(kb, _mm512_maskz_loadu_ps(tm, diff + j));
      _mm512_mask_storeu_ps(row + j, tm, _mm512_add_ps(_mm512_maskz_loadu_ps(tm, row + j), p));
    }
  }
  // (d) o = S^T q from the UPDATED state.
  for (size_t j = 0; j < W; ++j) acc[j] = 0.0f;
  for (size_t i = 0; i < D; ++i) {
    if (q[i] == 0.0f) continue;
    const float* row = S + i * D;
    const __m512 qi = _mm512_set1_ps(q[i]);
    size_t j = 0;
    for (; j < full; j += 16) {
      const __m512 p = _mm512_mul_ps(qi, _mm512_loadu_ps(row + j));
      _mm512_storeu_ps(acc + j, _mm512_add_ps(_mm512_loadu_ps(acc + j), p));
    }
    if (tm) {
      const __m512 p = _mm512_mul_ps(qi, _mm512_maskz_loadu_ps(tm, row + j));
      _mm512_mask_storeu_ps(acc + j, tm, _mm512_add_ps(_mm512_maskz_loadu_ps(tm, acc + j), p));
    }
  }
  for (size_t j = 0; j < W; ++j) o[j] = acc[j];
}

}  // namespace

void kda_step_avx512(float* S, const float* alpha, const float* k, const float* v, float beta, const float* q,
                     float* o, size_t D) {
  for (size_t j0 = 0; j0 < D; j0 += kKdaStrip)
    strip_avx512(S + j0, alpha, k, v + j0, beta, q, o + j0, D, D - j0 < kKdaStrip ? D - j0 : kKdaStrip);
}

}  // namespace k3::kernels::detail
