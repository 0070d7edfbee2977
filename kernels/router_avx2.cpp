// Router logits, AVX2 + FMA: experts across the lanes. Eight rows are read eight elements at a
// time and transposed in registers (router_transpose.hpp), so lane e of an accumulator takes
// w[e][i] * x[t][i] for i in ascending order -- exactly the scalar body's single sequential f64
// chain per (expert, input) (products of f32-representable values are exact, so vfmadd...pd equals
// multiply-then-add). Each transposed block serves up to four inputs.
#include <immintrin.h>

#include <cstddef>
#include <cstdint>

#include "kernels/router_bodies.hpp"
#include "kernels/router_transpose.hpp"

namespace k3::kernels::detail {

namespace {

// G groups of eight experts against NT inputs (independent chains hide the FMA latency).
template <int G, int NT, class T>
void block(const T* w, size_t hidden, const double* x, float* logit, size_t ls) {
  __m256d acc[G][NT][2];
#pragma GCC unroll 4
  for (int g = 0; g < G; ++g) {
#pragma GCC unroll 4
    for (int t = 0; t < NT; ++t) acc[g][t][0] = acc[g][t][1] = _mm256_setzero_pd();
  }
  const size_t full = hidden / 8 * 8;
  for (size_t i = 0; i < full; i += 8) {
    __m256 v[G][8];
#pragma GCC unroll 4
    for (int g = 0; g < G; ++g) transpose8(w + g * 8 * hidden, hidden, i, v[g]);
#pragma GCC unroll 8
    for (int k = 0; k < 8; ++k) {
#pragma GCC unroll 4
      for (int g = 0; g < G; ++g) {
        const __m256d lo = _mm256_cvtps_pd(_mm256_castps256_ps128(v[g][k]));
        const __m256d hi = _mm256_cvtps_pd(_mm256_extractf128_ps(v[g][k], 1));
#pragma GCC unroll 4
        for (int t = 0; t < NT; ++t) {
          const __m256d xi = _mm256_broadcast_sd(x + t * hidden + i + k);
          acc[g][t][0] = _mm256_fmadd_pd(lo, xi, acc[g][t][0]);
          acc[g][t][1] = _mm256_fmadd_pd(hi, xi, acc[g][t][1]);
        }
      }
    }
  }
#pragma GCC unroll 4
  for (int g = 0; g < G; ++g) {
#pragma GCC unroll 4
    for (int t = 0; t < NT; ++t) {
      double a[8];
      _mm256_storeu_pd(a, acc[g][t][0]);
      _mm256_storeu_pd(a + 4, acc[g][t][1]);
      finish_chains(a, w + g * 8 * hidden, hidden, full, x + t * hidden, logit + t * ls + g * 8);
    }
  }
}

// One pass over the experts for NT inputs: two groups of eight at a time for one input, one group
// for several (their accumulators fill the sixteen registers).
template <int NT, class T>
void logits_nt(const T* w, size_t n, size_t hidden, const double* x, float* logit, size_t ls) {
  constexpr int G = NT == 1 ? 2 : 1;
  size_t e = 0;
  for (; e + 8 * G <= n; e += 8 * G) block<G, NT>(w + e * hidden, hidden, x, logit + e, ls);
  for (; e + 8 <= n; e += 8) block<1, NT>(w + e * hidden, hidden, x, logit + e, ls);
  single_experts(w, e, n, hidden, x, NT, logit, ls);
}

template <class T>
void logits(const T* w, size_t n, size_t hidden, const double* x, size_t tokens, float* logit, size_t ls) {
  size_t t = 0;
  for (; t + 4 <= tokens; t += 4) logits_nt<4>(w, n, hidden, x + t * hidden, logit + t * ls, ls);
  for (; t + 2 <= tokens; t += 2) logits_nt<2>(w, n, hidden, x + t * hidden, logit + t * ls, ls);
  for (; t < tokens; ++t) logits_nt<1>(w, n, hidden, x + t * hidden, logit + t * ls, ls);
}

}  // namespace

void router_logits_f32_avx2(const float* w, size_t n, size_t hidden, const double* x, size_t tokens,
                            float* logit, size_t logit_stride) {
  logits(w, n, hidden, x, tokens, logit, logit_stride);
}

void router_logits_bf16_avx2(const uint16_t* w, size_t n, size_t hidden, const double* x, size_t tokens,
                             float* logit, size_t logit_stride) {
  logits(w, n, hidden, x, tokens, logit, logit_stride);
}

}  // namespace k3::kernels::detail
