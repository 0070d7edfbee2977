// AVX-512 bodies of the dense (docs/model.md §5.3) and MXFP4 (§5.4) matmuls. Raw pointers and
// internal-linkage helpers only (see matmul_bodies.hpp). Every f64 product here is of two
// f32-representable values, hence exact, so vfmadd...pd equals the contract's fma64.
// GCC 12 warns inside its own AVX-512 headers (_mm512_undefined_* placeholders); not our code.
// Clang has no -Wmaybe-uninitialized (it would warn about the unknown option) and no such warning.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#include <immintrin.h>

#include <cstddef>
#include <cstdint>

#include "kernels/matmul_avx512_tree.hpp"
#include "kernels/matmul_bodies.hpp"

namespace k3::kernels::detail {

namespace {

// ---- dense ----------------------------------------------------------------------------------

// Elements ahead of the current block to prefetch; the rows stream from DRAM once per matvec.
constexpr size_t kPrefetchAhead = 256;
// With several inputs a block of rows is passed once per group of inputs, and the first pass takes
// the weights from DRAM while computing three inputs per weight: each block takes ~3x a matvec's
// time, so 256 elements ahead no longer cover the DRAM latency. 512 ran a B = 8 matmul 3-5 % faster
// (1024, or an extra L2 prefetch of the next block of rows, were slower; docs/performance.md).
constexpr size_t kPrefetchAheadBatch = 512;

// Elements i..i+7 and i+8..i+15 of a row, widened exactly to f64.
struct F32Load {
  const float* w;
  void operator()(size_t i, __m512d& lo, __m512d& hi) const {
    lo = _mm512_cvtps_pd(_mm256_loadu_ps(w + i));
    hi = _mm512_cvtps_pd(_mm256_loadu_ps(w + i + 8));
  }
  double at(size_t i) const { return static_cast<double>(w[i]); }
  void prefetch(size_t i) const { _mm_prefetch(reinterpret_cast<const char*>(w + i), _MM_HINT_T0); }
};

// NR rows (loaders) against one input: independent accumulators interleave the FMA chains.
template <int NR, class Load>
void dense_rows(const Load* rows, size_t n, const double* x, float* out) {
  __m512d A[NR], B[NR];
#pragma GCC unroll 8
  for (int r = 0; r < NR; ++r) A[r] = B[r] = _mm512_setzero_pd();
  const size_t full = n / 16 * 16;
  for (size_t i = 0; i < full; i += 16) {
    const __m512d x0 = _mm512_loadu_pd(x + i);
    const __m512d x1 = _mm512_loadu_pd(x + i + 8);
#pragma GCC unroll 8
    for (int r = 0; r < NR; ++r) {
      __m512d lo, hi;
      rows[r].prefetch(i + kPrefetchAhead);
      rows[r](i, lo, hi);
      A[r] = _mm512_fmadd_pd(lo, x0, A[r]);
      B[r] = _mm512_fmadd_pd(hi, x1, B[r]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < NR; ++r) {
    double acc = reduce16(A[r], B[r]);
    for (size_t i = full; i < n; ++i) acc = acc + rows[r].at(i) * x[i];  // exact product: = fma64
    out[r] = static_cast<float>(acc);
  }
}

// One row against NT inputs: the weights are widened once per block for all tokens.
template <int NT, class Load>
void dense_tokens(const Load& row, size_t n, const double* x, size_t x_stride, float* y, size_t y_stride) {
  __m512d A[NT], B[NT];
#pragma GCC unroll 8
  for (int t = 0; t < NT; ++t) A[t] = B[t] = _mm512_setzero_pd();
  const size_t full = n / 16 * 16;
  for (size_t i = 0; i < full; i += 16) {
    __m512d lo, hi;
    row(i, lo, hi);
#pragma GCC unroll 8
    for (int t = 0; t < NT; ++t) {
      A[t] = _mm512_fmadd_pd(lo, _mm512_loadu_pd(x + t * x_stride + i), A[t]);
      B[t] = _mm512_fmadd_pd(hi, _mm512_loadu_pd(x + t * x_stride + i + 8), B[t]);
    }
  }
#pragma GCC unroll 8
  for (int t = 0; t < NT; ++t) {
    double acc = reduce16(A[t], B[t]);
    for (size_t i = full; i < n; ++i) acc = acc + row.at(i) * x[t * x_stride + i];
    y[t * y_stride] = static_cast<float>(acc);
  }
}

template <class T, class Load>
void dense(const T* w, size_t rows, size_t cols, const double* x, size_t tokens, float* y, size_t y_stride) {
  if (tokens == 1) {
    size_t r = 0;
    for (; r + 4 <= rows; r += 4) {
      const Load l[4] = {{w + r * cols}, {w + (r + 1) * cols}, {w + (r + 2) * cols}, {w + (r + 3) * cols}};
      dense_rows<4>(l, cols, x, y + r);
    }
    for (; r < rows; ++r) {
      const Load l[1] = {{w + r * cols}};
      dense_rows<1>(l, cols, x, y + r);
    }
    return;
  }
  for (size_t r = 0; r < rows; ++r) {
    const Load l{w + r * cols};
    size_t t = 0;
    for (; t + 4 <= tokens; t += 4)
      dense_tokens<4>(l, cols, x + t * cols, cols, y + t * y_stride + r, y_stride);
    for (; t < tokens; ++t) dense_tokens<1>(l, cols, x + t * cols, cols, y + t * y_stride + r, y_stride);
  }
}

void f32_rows(const float* w, size_t rows, size_t cols, const double* x, size_t tokens, float* y,
              size_t y_stride) {
  dense<float, F32Load>(w, rows, cols, x, tokens, y, y_stride);
}

// bf16, one block of 16 at a time. Interleaving each 16-bit weight above a zero word (a 256-bit
// unpack works per 128-bit lane) widens it to f32 in one instruction, but lands elements 0-3, 8-11
// in one register and 4-7, 12-15 in the other. So the sixteen §5.3 lanes are held as
// P = a0-3, a8-11 and Q = a4-7, a12-15, fed block by block in order, x is regrouped to match, and
// the tree still pairs a_j with a_{j+4} first (see reduce_pq). With kPqX the caller widened x
// already regrouped (widen_pq in kernels/matmul.cpp: each full block of 16 stored as P then Q), so
// the body loads P and Q as they are instead of shuffling every block for every block of rows.
// NR rows (n apart) against NT inputs (x_stride apart); y[t * y_stride + r].
template <int NR, int NT, bool kPqX>
void bf16_block(const uint16_t* w, size_t n, const double* x, size_t x_stride, float* y, size_t y_stride) {
  __m512d P[NR][NT], Q[NR][NT];
#pragma GCC unroll 8
  for (int r = 0; r < NR; ++r) {
#pragma GCC unroll 8
    for (int t = 0; t < NT; ++t) P[r][t] = Q[r][t] = _mm512_setzero_pd();
  }
  const size_t full = n / 16 * 16;
  for (size_t i = 0; i < full; i += 16) {
    __m512d xp[NT], xq[NT];
#pragma GCC unroll 8
    for (int t = 0; t < NT; ++t) {
      const __m512d X0 = _mm512_loadu_pd(x + t * x_stride + i);
      const __m512d X1 = _mm512_loadu_pd(x + t * x_stride + i + 8);
      if constexpr (kPqX) {
        xp[t] = X0;
        xq[t] = X1;
      } else {
        xp[t] = _mm512_shuffle_f64x2(X0, X1, 0x44);  // x0-3, x8-11
        xq[t] = _mm512_shuffle_f64x2(X0, X1, 0xEE);  // x4-7, x12-15
      }
    }
#pragma GCC unroll 8
    for (int r = 0; r < NR; ++r) {
      const uint16_t* wr = w + r * n + i;
      _mm_prefetch(reinterpret_cast<const char*>(wr + (NT > 1 ? kPrefetchAheadBatch : kPrefetchAhead)),
                   _MM_HINT_T0);
      const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wr));
      const __m512d p =
          _mm512_cvtps_pd(_mm256_castsi256_ps(_mm256_unpacklo_epi16(_mm256_setzero_si256(), raw)));
      const __m512d q =
          _mm512_cvtps_pd(_mm256_castsi256_ps(_mm256_unpackhi_epi16(_mm256_setzero_si256(), raw)));
#pragma GCC unroll 8
      for (int t = 0; t < NT; ++t) {
        P[r][t] = _mm512_fmadd_pd(p, xp[t], P[r][t]);
        Q[r][t] = _mm512_fmadd_pd(q, xq[t], Q[r][t]);
      }
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < NR; ++r) {
#pragma GCC unroll 8
    for (int t = 0; t < NT; ++t) {
      double acc = reduce_pq(P[r][t], Q[r][t]);
      // the columns past the last full block: in natural order in both layouts
      for (size_t i = full; i < n; ++i) acc = acc + bf16_at(w + r * n, i) * x[t * x_stride + i];
      y[t * y_stride + r] = static_cast<float>(acc);
    }
  }
}

// Several tokens (a batched decode step, a prefill): four rows against two or three inputs at a time. Each
// input's row block is reused from L1/L2 for every input, and the x loads are shared by four rows;
// one row against four inputs re-read the whole x from L2 for every weight row and ran no faster
// than one matvec per token (5 bf16 4096x4096 matrices, 8 tokens: ~2x faster this way). Every
// (row, input) pair keeps its own accumulators, so the bits are the one-row ones.
template <bool kPqX>
void bf16_tokens(const uint16_t* w, size_t rows, size_t cols, const double* x, size_t tokens, float* y,
                 size_t y_stride) {
  // With x already in P/Q order, inputs three at a time, then in pairs (3k + 1 inputs end in two pairs,
  // not a single one): 24 accumulators, 6 x and 2 widened weight registers, and the widening of each
  // weight shared by three inputs instead of two. B = 8: ~+13 % over pairs only (docs/performance.md).
  // The shuffling layout keeps pairs: its x regrouping needs the registers a third input would take.
  size_t triples = 0;
  if constexpr (kPqX) {
    triples = tokens / 3;
    if (tokens % 3 == 1 && triples > 0) --triples;
  }
  size_t r = 0;
  for (; r + 4 <= rows; r += 4) {
    size_t t = 0;
    for (; t < 3 * triples; t += 3)
      bf16_block<4, 3, kPqX>(w + r * cols, cols, x + t * cols, cols, y + t * y_stride + r, y_stride);
    for (; t + 2 <= tokens; t += 2)
      bf16_block<4, 2, kPqX>(w + r * cols, cols, x + t * cols, cols, y + t * y_stride + r, y_stride);
    for (; t < tokens; ++t)
      bf16_block<4, 1, kPqX>(w + r * cols, cols, x + t * cols, cols, y + t * y_stride + r, y_stride);
  }
  for (; r < rows; ++r) {
    size_t t = 0;
    for (; t + 2 <= tokens; t += 2)
      bf16_block<1, 2, kPqX>(w + r * cols, cols, x + t * cols, cols, y + t * y_stride + r, y_stride);
    for (; t < tokens; ++t)
      bf16_block<1, 1, kPqX>(w + r * cols, cols, x + t * cols, cols, y + t * y_stride + r, y_stride);
  }
}

void bf16_rows(const uint16_t* w, size_t rows, size_t cols, const double* x, size_t tokens, float* y,
               size_t y_stride) {
  if (tokens == 1) {
    size_t r = 0;
    // Eight rows in flight: eight weight streams keep DRAM busy and 16 independent chains hide the
    // FMA latency (measured ~20% over four rows when streaming).
    for (; r + 8 <= rows; r += 8) bf16_block<8, 1, false>(w + r * cols, cols, x, cols, y + r, y_stride);
    for (; r + 4 <= rows; r += 4) bf16_block<4, 1, false>(w + r * cols, cols, x, cols, y + r, y_stride);
    for (; r < rows; ++r) bf16_block<1, 1, false>(w + r * cols, cols, x, cols, y + r, y_stride);
    return;
  }
  bf16_tokens<false>(w, rows, cols, x, tokens, y, y_stride);
}

// x widened in the P/Q layout (MatmulBodies::bf16_pq): the shuffles of every block of 16 were ~4 of
// the ~20 non-FMA instructions per 16 FMAs of the 4 x 2 block; without them a B = 8 matmul ran
// ~10 % faster, and the freed registers hold a third input (docs/performance.md, "A batch of rows").
void bf16_rows_pq(const uint16_t* w, size_t rows, size_t cols, const double* x, size_t tokens, float* y,
                  size_t y_stride) {
  bf16_tokens<true>(w, rows, cols, x, tokens, y, y_stride);
}

// ---- MXFP4 ----------------------------------------------------------------------------------

constexpr size_t G = 32;
constexpr size_t kPrefetchBytes = 512;  // of packed nibbles, ahead of the four groups in hand

// 2^(b-127) as f64 (exact, = f64 of the f32 E8M0 value for b <= 254).
double e8m0(uint8_t b) {
  const uint64_t bits = static_cast<uint64_t>(b + 896) << 52;
  double d;
  __builtin_memcpy(&d, &bits, sizeof d);
  return d;
}

double e2m1(uint8_t nib) {
  static const double t[16] = {0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6};
  return t[nib & 0xF];
}

// A group the fast path does not take (partial last group): the pseudo-code as written.
double group_generic(const uint8_t* bytes, size_t n, const double* x) {
  auto elem = [&](size_t i) { return e2m1((i & 1) ? bytes[i >> 1] >> 4 : bytes[i >> 1]); };
  double s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  const size_t full = n / 8 * 8;
  for (size_t c = 0; c < full; c += 8) {
#pragma GCC unroll 8
    for (size_t l = 0; l < 8; ++l) s[l] = s[l] + elem(c + l) * x[c + l];
  }
  double sub = ((s[0] + s[4]) + (s[1] + s[5])) + ((s[2] + s[6]) + (s[3] + s[7]));
  for (size_t i = full; i < n; ++i) sub = sub + elem(i) * x[i];
  return sub;
}

// The 32 E2M1 values of a full group as four f64 vectors: chunk c holds elements 8c..8c+7, so
// lane l of the group's accumulator receives elements l, 8+l, 16+l, 24+l in that order.
struct Group {
  __m512d w[4];
};

[[gnu::always_inline]] inline Group decode(const uint8_t* bytes) {
  const __m512d pos = _mm512_setr_pd(0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0);
  const __m512d neg = _mm512_setr_pd(-0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0);
  // Little-endian: nibble k of the 64-bit word holding bytes 8h..8h+7 is element 16h+k (low nibble
  // = even element). Lane l shifted by 4l (+32 for the odd chunk) brings its element to bits 0-3;
  // permutex2var reads only those 4 index bits, and bit 3 (the E2M1 sign) picks the negative half.
  const __m512i shift_even = _mm512_setr_epi64(0, 4, 8, 12, 16, 20, 24, 28);
  const __m512i shift_odd = _mm512_setr_epi64(32, 36, 40, 44, 48, 52, 56, 60);
  uint64_t word[2];
  __builtin_memcpy(word, bytes, 16);
  Group g;
#pragma GCC unroll 2
  for (int h = 0; h < 2; ++h) {
    const __m512i b = _mm512_set1_epi64(static_cast<long long>(word[h]));
    g.w[2 * h] = _mm512_permutex2var_pd(pos, _mm512_srlv_epi64(b, shift_even), neg);
    g.w[2 * h + 1] = _mm512_permutex2var_pd(pos, _mm512_srlv_epi64(b, shift_odd), neg);
  }
  return g;
}

// s_l over the four chunks, then t_j = s_j + s_{j+4} (lo256 + hi256).
[[gnu::always_inline]] inline __m256d group_partial(const Group& g, const __m512d x[4]) {
  __m512d s = _mm512_fmadd_pd(g.w[0], x[0], _mm512_setzero_pd());
  s = _mm512_fmadd_pd(g.w[1], x[1], s);
  s = _mm512_fmadd_pd(g.w[2], x[2], s);
  s = _mm512_fmadd_pd(g.w[3], x[3], s);
  return _mm256_add_pd(_mm512_castpd512_pd256(s), _mm512_extractf64x4_pd(s, 1));
}

// The group's 32 inputs, loaded once for all the rows of a block.
struct GroupX {
  __m512d v[4];
};

[[gnu::always_inline]] inline GroupX load_group_x(const double* x) {
  return {{_mm512_loadu_pd(x), _mm512_loadu_pd(x + 8), _mm512_loadu_pd(x + 16), _mm512_loadu_pd(x + 24)}};
}

// Four groups' t vectors -> their subs (t0+t1)+(t2+t3), one per lane, in group order.
[[gnu::always_inline]] inline __m256d subs4(__m256d t0, __m256d t1, __m256d t2, __m256d t3) {
  const __m256d h01 = _mm256_hadd_pd(t0, t1);  // [t0_0+t0_1, t1_0+t1_1, t0_2+t0_3, t1_2+t1_3]
  const __m256d h23 = _mm256_hadd_pd(t2, t3);
  const __m256d a = _mm256_permute2f128_pd(h01, h23, 0x20);  // (t_k0 + t_k1) for k = 0..3
  const __m256d b = _mm256_permute2f128_pd(h01, h23, 0x31);  // (t_k2 + t_k3)
  return _mm256_add_pd(a, b);
}

[[gnu::always_inline]] inline double sub1(__m256d t) {
  const __m128d lo = _mm256_castpd256_pd128(t);
  const __m128d hi = _mm256_extractf128_pd(t, 1);
  return (_mm_cvtsd_f64(lo) + _mm_cvtsd_f64(_mm_unpackhi_pd(lo, lo))) +
         (_mm_cvtsd_f64(hi) + _mm_cvtsd_f64(_mm_unpackhi_pd(hi, hi)));
}

// Scales of four groups as f64, and which of them are not skipped (byte != 255).
[[gnu::always_inline]] inline __m256d scales4(const uint8_t* s, __mmask8& keep) {
  uint32_t raw;
  __builtin_memcpy(&raw, s, 4);
  const __m128i b = _mm_cvtsi32_si128(static_cast<int>(raw));
  keep = static_cast<__mmask8>(~_mm_cmpeq_epi8_mask(b, _mm_set1_epi8(static_cast<char>(0xFF))) & 0xF);
  const __m256i e = _mm256_slli_epi64(_mm256_add_epi64(_mm256_cvtepu8_epi64(b), _mm256_set1_epi64x(896)), 52);
  return _mm256_castsi256_pd(e);
}

// acc + p0 + p1 + p2 + p3 in that order (a skipped group's lane is +0; acc is never -0, so adding
// +0 leaves it unchanged, exactly like skipping).
[[gnu::always_inline]] inline double add4(double acc, __m256d p) {
  const __m128d lo = _mm256_castpd256_pd128(p);
  const __m128d hi = _mm256_extractf128_pd(p, 1);
  acc = acc + _mm_cvtsd_f64(lo);
  acc = acc + _mm_cvtsd_f64(_mm_unpackhi_pd(lo, lo));
  acc = acc + _mm_cvtsd_f64(hi);
  acc = acc + _mm_cvtsd_f64(_mm_unpackhi_pd(hi, hi));
  return acc;
}

// NR rows (pc / sc bytes apart) for NT inputs (cols apart): each group is decoded once for all
// inputs, and the rows' independent chains interleave.
template <int NR, int NT>
void mxfp4_block(const uint8_t* packed, size_t pc, const uint8_t* scales, size_t sc, size_t cols,
                 const double* x, float* y, size_t y_stride) {
  const size_t groups = (cols + G - 1) / G;
  const size_t full = cols / G;  // complete 32-element groups
  double acc[NR][NT];
#pragma GCC unroll 8
  for (int r = 0; r < NR; ++r) {
#pragma GCC unroll 8
    for (int t = 0; t < NT; ++t) acc[r][t] = 0.0;
  }
  size_t g = 0;
  for (; g + 4 <= full; g += 4) {
    __m256d tv[NR][NT][4];
#pragma GCC unroll 8
    for (int k = 0; k < 4; ++k) {
      GroupX xk[NT];
#pragma GCC unroll 8
      for (int t = 0; t < NT; ++t) xk[t] = load_group_x(x + t * cols + (g + k) * G);
#pragma GCC unroll 8
      for (int r = 0; r < NR; ++r) {
        // A skipped group's lanes are computed (the inputs may hold inf / NaN) but masked out below.
        const Group w = decode(packed + r * pc + (g + k) * G / 2);
#pragma GCC unroll 8
        for (int t = 0; t < NT; ++t) tv[r][t][k] = group_partial(w, xk[t].v);
      }
    }
#pragma GCC unroll 8
    for (int r = 0; r < NR; ++r) {
      _mm_prefetch(reinterpret_cast<const char*>(packed + r * pc + g * G / 2 + kPrefetchBytes), _MM_HINT_T0);
      __mmask8 keep;
      const __m256d s4 = scales4(scales + r * sc + g, keep);
#pragma GCC unroll 8
      for (int t = 0; t < NT; ++t) {
        const __m256d sub = subs4(tv[r][t][0], tv[r][t][1], tv[r][t][2], tv[r][t][3]);
        acc[r][t] = add4(acc[r][t], _mm256_maskz_mul_pd(keep, sub, s4));  // separate multiply, then add
      }
    }
  }
  for (; g < groups; ++g) {
#pragma GCC unroll 8
    for (int r = 0; r < NR; ++r) {
      const uint8_t b = scales[r * sc + g];
      if (b == 255) continue;
      const double s = e8m0(b);
      const uint8_t* bytes = packed + r * pc + g * G / 2;
      if (g < full) {
        const Group w = decode(bytes);
#pragma GCC unroll 8
        for (int t = 0; t < NT; ++t) {
          const GroupX xg = load_group_x(x + t * cols + g * G);
          acc[r][t] = acc[r][t] + sub1(group_partial(w, xg.v)) * s;
        }
      } else {
#pragma GCC unroll 8
        for (int t = 0; t < NT; ++t) {
          acc[r][t] = acc[r][t] + group_generic(bytes, cols - g * G, x + t * cols + g * G) * s;
        }
      }
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < NR; ++r) {
#pragma GCC unroll 8
    for (int t = 0; t < NT; ++t) y[t * y_stride + r] = static_cast<float>(acc[r][t]);
  }
}

void mxfp4_rows(const uint8_t* packed, const uint8_t* scales, size_t rows, size_t cols, const double* x,
                size_t tokens, float* y, size_t y_stride) {
  const size_t pc = (cols + 1) / 2, sc = (cols + G - 1) / G;
  if (tokens == 1) {
    size_t r = 0;
    for (; r + 4 <= rows; r += 4)
      mxfp4_block<4, 1>(packed + r * pc, pc, scales + r * sc, sc, cols, x, y + r, 0);
    for (; r < rows; ++r) mxfp4_block<1, 1>(packed + r * pc, pc, scales + r * sc, sc, cols, x, y + r, 0);
    return;
  }
  for (size_t r = 0; r < rows; ++r) {
    size_t t = 0;
    for (; t + 2 <= tokens; t += 2) {
      mxfp4_block<1, 2>(packed + r * pc, pc, scales + r * sc, sc, cols, x + t * cols, y + t * y_stride + r,
                        y_stride);
    }
    for (; t < tokens; ++t) {
      mxfp4_block<1, 1>(packed + r * pc, pc, scales + r * sc, sc, cols, x + t * cols, y + t * y_stride + r,
                        y_stride);
    }
  }
}

}  // namespace

MatmulBodies matmul_bodies_avx512() {
  return {f32_rows, bf16_rows, mxfp4_rows, bf16_rows_pq};
}

}  // namespace k3::kernels::detail
