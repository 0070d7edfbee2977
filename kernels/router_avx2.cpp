// Router logits, AVX2 + FMA: experts across the lanes. Eight rows are read eight elements at a
// time and transposed in registers, so lane e of an accumulator takes w[e][i] * x[i] for i in
// ascending order -- exactly the scalar body's single sequential f64 chain per expert (products
// of f32-representable values are exact, so vfmadd...pd equals multiply-then-add).
#include <immintrin.h>

#include <cstddef>
#include <cstdint>

#include "kernels/router_bodies.hpp"

namespace k3::kernels::detail {

namespace {

// Element i+k of rows 0..7, k = 0..7, widened to f32.
[[gnu::always_inline]] inline void transpose8(const float* w, size_t hidden, size_t i, __m256 v[8]) {
  __m256 r[8], t[8], u[8];
#pragma GCC unroll 8
  for (int e = 0; e < 8; ++e) r[e] = _mm256_loadu_ps(w + e * hidden + i);
#pragma GCC unroll 4
  for (int e = 0; e < 8; e += 2) {
    t[e] = _mm256_unpacklo_ps(r[e], r[e + 1]);
    t[e + 1] = _mm256_unpackhi_ps(r[e], r[e + 1]);
  }
#pragma GCC unroll 2
  for (int h = 0; h < 8; h += 4) {
    u[h] = _mm256_shuffle_ps(t[h], t[h + 2], 0x44);
    u[h + 1] = _mm256_shuffle_ps(t[h], t[h + 2], 0xEE);
    u[h + 2] = _mm256_shuffle_ps(t[h + 1], t[h + 3], 0x44);
    u[h + 3] = _mm256_shuffle_ps(t[h + 1], t[h + 3], 0xEE);
  }
#pragma GCC unroll 4
  for (int k = 0; k < 4; ++k) {
    v[k] = _mm256_permute2f128_ps(u[k], u[k + 4], 0x20);
    v[k + 4] = _mm256_permute2f128_ps(u[k], u[k + 4], 0x31);
  }
}

[[gnu::always_inline]] inline void transpose8(const uint16_t* w, size_t hidden, size_t i, __m256 v[8]) {
  __m128i r[8], t[8], u[8];
#pragma GCC unroll 8
  for (int e = 0; e < 8; ++e) r[e] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w + e * hidden + i));
#pragma GCC unroll 4
  for (int e = 0; e < 8; e += 2) {
    t[e] = _mm_unpacklo_epi16(r[e], r[e + 1]);
    t[e + 1] = _mm_unpackhi_epi16(r[e], r[e + 1]);
  }
#pragma GCC unroll 2
  for (int h = 0; h < 8; h += 4) {
    u[h] = _mm_unpacklo_epi32(t[h], t[h + 2]);
    u[h + 1] = _mm_unpackhi_epi32(t[h], t[h + 2]);
    u[h + 2] = _mm_unpacklo_epi32(t[h + 1], t[h + 3]);
    u[h + 3] = _mm_unpackhi_epi32(t[h + 1], t[h + 3]);
  }
#pragma GCC unroll 4
  for (int k = 0; k < 4; ++k) {
    const __m128i lo = _mm_unpacklo_epi64(u[k], u[k + 4]);
    const __m128i hi = _mm_unpackhi_epi64(u[k], u[k + 4]);
    // u[k] holds elements 2k, 2k+1 of rows 0-3; u[k+4] the same of rows 4-7.
    v[2 * k] = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(lo), 16));
    v[2 * k + 1] = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(hi), 16));
  }
}

double widen(float v) {
  return static_cast<double>(v);
}
double widen(uint16_t v) {
  const uint32_t bits = static_cast<uint32_t>(v) << 16;
  float f;
  __builtin_memcpy(&f, &bits, sizeof f);
  return static_cast<double>(f);
}

// G groups of eight experts at a time (independent chains hide the FMA latency).
template <int G, class T>
void block(const T* w, size_t hidden, const double* x, float* logit) {
  __m256d acc[G][2];
#pragma GCC unroll 4
  for (int g = 0; g < G; ++g) acc[g][0] = acc[g][1] = _mm256_setzero_pd();
  const size_t full = hidden / 8 * 8;
  for (size_t i = 0; i < full; i += 8) {
    __m256 v[G][8];
#pragma GCC unroll 4
    for (int g = 0; g < G; ++g) transpose8(w + g * 8 * hidden, hidden, i, v[g]);
#pragma GCC unroll 8
    for (int k = 0; k < 8; ++k) {
      const __m256d xi = _mm256_broadcast_sd(x + i + k);
#pragma GCC unroll 4
      for (int g = 0; g < G; ++g) {
        acc[g][0] = _mm256_fmadd_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(v[g][k])), xi, acc[g][0]);
        acc[g][1] = _mm256_fmadd_pd(_mm256_cvtps_pd(_mm256_extractf128_ps(v[g][k], 1)), xi, acc[g][1]);
      }
    }
  }
#pragma GCC unroll 4
  for (int g = 0; g < G; ++g) {
    double a[8];
    _mm256_storeu_pd(a, acc[g][0]);
    _mm256_storeu_pd(a + 4, acc[g][1]);
    for (int e = 0; e < 8; ++e) {
      const T* row = w + (g * 8 + e) * hidden;
      for (size_t i = full; i < hidden; ++i) a[e] = a[e] + widen(row[i]) * x[i];  // the chain goes on
      logit[g * 8 + e] = static_cast<float>(a[e]);
    }
  }
}

template <class T>
void logits(const T* w, size_t n, size_t hidden, const double* x, float* logit) {
  size_t e = 0;
  for (; e + 16 <= n; e += 16) block<2>(w + e * hidden, hidden, x, logit + e);
  for (; e + 8 <= n; e += 8) block<1>(w + e * hidden, hidden, x, logit + e);
  for (; e < n; ++e) {
    double a = 0.0;
    for (size_t i = 0; i < hidden; ++i) a = a + widen(w[e * hidden + i]) * x[i];
    logit[e] = static_cast<float>(a);
  }
}

}  // namespace

void router_logits_f32_avx2(const float* w, size_t n, size_t hidden, const double* x, float* logit) {
  logits(w, n, hidden, x, logit);
}

void router_logits_bf16_avx2(const uint16_t* w, size_t n, size_t hidden, const double* x, float* logit) {
  logits(w, n, hidden, x, logit);
}

}  // namespace k3::kernels::detail
