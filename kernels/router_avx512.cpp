// Router logits, AVX-512: experts across the eight f64 lanes of a zmm register. The gate is read
// and transposed as in the AVX2 body (router_transpose.hpp), eight rows by eight elements, and each
// transposed block is widened once and serves up to eight inputs, so a batched step (several rows
// of x) reads and transposes every gate row once instead of once per row. Lane e of acc[g][t] takes
// w[8g + e][i] * x[t][i] for i in ascending order: the scalar body's one sequential f64 chain per
// (expert, input), so every body writes the same bits.
// GCC 12 warns inside its own AVX-512 headers (_mm512_undefined_* placeholders); not our code.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#include <immintrin.h>

#include <cstddef>
#include <cstdint>

#include "kernels/router_bodies.hpp"
#include "kernels/router_transpose.hpp"

namespace k3::kernels::detail {

namespace {

// G groups of eight experts against NT inputs.
template <int G, int NT, class T>
void block(const T* w, size_t hidden, const double* x, float* logit, size_t ls) {
  __m512d acc[G][NT];
#pragma GCC unroll 4
  for (int g = 0; g < G; ++g) {
#pragma GCC unroll 8
    for (int t = 0; t < NT; ++t) acc[g][t] = _mm512_setzero_pd();
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
        const __m512d wk = _mm512_cvtps_pd(v[g][k]);
#pragma GCC unroll 8
        for (int t = 0; t < NT; ++t)
          acc[g][t] = _mm512_fmadd_pd(wk, _mm512_set1_pd(x[t * hidden + i + k]), acc[g][t]);
      }
    }
  }
#pragma GCC unroll 4
  for (int g = 0; g < G; ++g) {
#pragma GCC unroll 8
    for (int t = 0; t < NT; ++t) {
      double a[8];
      _mm512_storeu_pd(a, acc[g][t]);
      finish_chains(a, w + g * 8 * hidden, hidden, full, x + t * hidden, logit + t * ls + g * 8);
    }
  }
}

// One pass over the experts for NT inputs: four groups of eight for one input (more chains in
// flight), two for up to four inputs, one for eight (the accumulators and the transposed block then
// fill the 32 registers).
template <int NT, class T>
void logits_nt(const T* w, size_t n, size_t hidden, const double* x, float* logit, size_t ls) {
  constexpr int G = NT <= 4 ? 2 : 1;
  size_t e = 0;
  for (; e + 8 * G <= n; e += 8 * G) block<G, NT>(w + e * hidden, hidden, x, logit + e, ls);
  for (; e + 8 <= n; e += 8) block<1, NT>(w + e * hidden, hidden, x, logit + e, ls);
  single_experts(w, e, n, hidden, x, NT, logit, ls);
}

template <class T>
void logits(const T* w, size_t n, size_t hidden, const double* x, size_t tokens, float* logit, size_t ls) {
  size_t t = 0;
  for (; t + 8 <= tokens; t += 8) logits_nt<8>(w, n, hidden, x + t * hidden, logit + t * ls, ls);
  for (; t + 4 <= tokens; t += 4) logits_nt<4>(w, n, hidden, x + t * hidden, logit + t * ls, ls);
  for (; t + 2 <= tokens; t += 2) logits_nt<2>(w, n, hidden, x + t * hidden, logit + t * ls, ls);
  for (; t < tokens; ++t) logits_nt<1>(w, n, hidden, x + t * hidden, logit + t * ls, ls);
}

}  // namespace

void router_logits_f32_avx512(const float* w, size_t n, size_t hidden, const double* x, size_t tokens,
                              float* logit, size_t logit_stride) {
  logits(w, n, hidden, x, tokens, logit, logit_stride);
}

void router_logits_bf16_avx512(const uint16_t* w, size_t n, size_t hidden, const double* x, size_t tokens,
                               float* logit, size_t logit_stride) {
  logits(w, n, hidden, x, tokens, logit, logit_stride);
}

}  // namespace k3::kernels::detail
