// Included only by the AVX-512 matmul translation units (matmul_avx512.cpp, matmul_exp3_avx512.cpp),
// each of which compiles its own copy (internal linkage; see matmul_bodies.hpp): the §5.3 reduction
// tree over the sixteen f64 lanes in the two orders the bodies hold them, and one bf16 value widened
// for the sequential tail. Every body that ends a dot product goes through these, so the tree is
// written once.
#pragma once
#include <immintrin.h>

#include <cstddef>
#include <cstdint>

namespace k3::kernels::detail {
namespace {

// A holds lanes a0..a7, B holds a8..a15 (natural order). The §5.3 tree pairs a_j with a_{j+4}
// first: P = lo(A)+hi(A), Q = lo(B)+hi(B), R = P+Q (= b_j), then (R0+R1)+(R2+R3). Not A+B first.
[[gnu::always_inline]] inline double reduce16(__m512d A, __m512d B) {
  const __m256d P = _mm256_add_pd(_mm512_castpd512_pd256(A), _mm512_extractf64x4_pd(A, 1));
  const __m256d Q = _mm256_add_pd(_mm512_castpd512_pd256(B), _mm512_extractf64x4_pd(B, 1));
  const __m256d R = _mm256_add_pd(P, Q);
  const __m128d lo = _mm256_castpd256_pd128(R);
  const __m128d hi = _mm256_extractf128_pd(R, 1);
  const double r01 = _mm_cvtsd_f64(lo) + _mm_cvtsd_f64(_mm_unpackhi_pd(lo, lo));
  const double r23 = _mm_cvtsd_f64(hi) + _mm_cvtsd_f64(_mm_unpackhi_pd(hi, hi));
  return r01 + r23;
}

// The bf16 bodies' lane order: interleaving each 16-bit weight above a zero word (a 256-bit unpack
// works per 128-bit lane) widens it to f32 in one instruction but lands elements 0-3, 8-11 in one
// register and 4-7, 12-15 in the other, so the lanes are held as P = a0-3, a8-11 and
// Q = a4-7, a12-15 (x regrouped to match); the tree still pairs a_j with a_{j+4} first.
[[gnu::always_inline]] inline double reduce_pq(__m512d P, __m512d Q) {
  const __m256d U = _mm256_add_pd(_mm512_castpd512_pd256(P), _mm512_castpd512_pd256(Q));  // a_j + a_{j+4}
  const __m256d V =
      _mm256_add_pd(_mm512_extractf64x4_pd(P, 1), _mm512_extractf64x4_pd(Q, 1));  // a_{j+8} + a_{j+12}
  const __m256d R = _mm256_add_pd(U, V);
  const __m128d lo = _mm256_castpd256_pd128(R);
  const __m128d hi = _mm256_extractf128_pd(R, 1);
  return (_mm_cvtsd_f64(lo) + _mm_cvtsd_f64(_mm_unpackhi_pd(lo, lo))) +
         (_mm_cvtsd_f64(hi) + _mm_cvtsd_f64(_mm_unpackhi_pd(hi, hi)));
}

// w[i] as f64 (exact: bf16 -> f32 moves the bits up, f32 -> f64 is exact).
inline double bf16_at(const uint16_t* w, size_t i) {
  const uint32_t bits = static_cast<uint32_t>(w[i]) << 16;
  float f;
  __builtin_memcpy(&f, &bits, sizeof f);
  return static_cast<double>(f);
}

}  // namespace
}  // namespace k3::kernels::detail
