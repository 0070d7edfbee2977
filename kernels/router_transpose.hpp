// Included only by the router's ISA translation units (router_avx2.cpp, router_avx512.cpp), each of
// which compiles its own copy (internal linkage): eight gate rows read eight elements at a time and
// transposed in registers, so v[k] holds element i + k of rows 0..7, widened exactly to f32; and the
// scalar parts both bodies share (the chains' tails, experts left over from the blocks of eight).
#pragma once
#include <immintrin.h>

#include <cstddef>
#include <cstdint>

namespace k3::kernels::detail {
namespace {

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

inline double widen_one(float v) {
  return static_cast<double>(v);
}
inline double widen_one(uint16_t v) {
  const uint32_t bits = static_cast<uint32_t>(v) << 16;
  float f;
  __builtin_memcpy(&f, &bits, sizeof f);
  return static_cast<double>(f);
}

// A block of eight experts' chains a[0..8) after the SIMD part (elements [0, full) of the rows at w):
// each chain goes on sequentially over the tail elements of its row, then is rounded to its logit.
template <class T>
void finish_chains(double a[8], const T* w, size_t hidden, size_t full, const double* x, float* logit) {
  for (int e = 0; e < 8; ++e) {
    const T* row = w + size_t(e) * hidden;
    for (size_t i = full; i < hidden; ++i) a[e] = a[e] + widen_one(row[i]) * x[i];
    logit[e] = static_cast<float>(a[e]);
  }
}

// Experts [e0, n) one at a time (fewer than a block of eight remain): the plain sequential chains.
template <class T>
void single_experts(const T* w, size_t e0, size_t n, size_t hidden, const double* x, size_t tokens,
                    float* logit, size_t logit_stride) {
  for (size_t e = e0; e < n; ++e) {
    for (size_t t = 0; t < tokens; ++t) {
      double a = 0.0;
      for (size_t i = 0; i < hidden; ++i) a = a + widen_one(w[e * hidden + i]) * x[t * hidden + i];
      logit[t * logit_stride + e] = static_cast<float>(a);
    }
  }
}

}  // namespace
}  // namespace k3::kernels::detail
