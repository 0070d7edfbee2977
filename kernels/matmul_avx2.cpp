// AVX2 + FMA bodies of the dense (docs/model.md §5.3) and MXFP4 (§5.4) matmuls. Raw pointers and
// internal-linkage helpers only (see matmul_bodies.hpp). Every f64 product here is of two
// f32-representable values, hence exact, so vfmadd...pd equals the contract's fma64.
#include <immintrin.h>

#include <cstddef>
#include <cstdint>

#include "kernels/matmul_bodies.hpp"

namespace k3::kernels::detail {

namespace {

// ---- dense ----------------------------------------------------------------------------------

// Elements ahead of the current block to prefetch; the rows stream from DRAM once per matvec.
constexpr size_t kPrefetchAhead = 256;

// Elements i..i+15 of a row widened exactly to f64: v[m] holds i+4m .. i+4m+3.
struct F32Load {
  const float* w;
  void operator()(size_t i, __m256d v[4]) const {
    const __m256 a = _mm256_loadu_ps(w + i);
    const __m256 b = _mm256_loadu_ps(w + i + 8);
    v[0] = _mm256_cvtps_pd(_mm256_castps256_ps128(a));
    v[1] = _mm256_cvtps_pd(_mm256_extractf128_ps(a, 1));
    v[2] = _mm256_cvtps_pd(_mm256_castps256_ps128(b));
    v[3] = _mm256_cvtps_pd(_mm256_extractf128_ps(b, 1));
  }
  double at(size_t i) const { return static_cast<double>(w[i]); }
  void prefetch(size_t i) const { _mm_prefetch(reinterpret_cast<const char*>(w + i), _MM_HINT_T0); }
};

struct Bf16Load {
  const uint16_t* w;
  void operator()(size_t i, __m256d v[4]) const {
    const __m128i r0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w + i));
    const __m128i r1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w + i + 8));
    const __m256 a = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(r0), 16));
    const __m256 b = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(r1), 16));
    v[0] = _mm256_cvtps_pd(_mm256_castps256_ps128(a));
    v[1] = _mm256_cvtps_pd(_mm256_extractf128_ps(a, 1));
    v[2] = _mm256_cvtps_pd(_mm256_castps256_ps128(b));
    v[3] = _mm256_cvtps_pd(_mm256_extractf128_ps(b, 1));
  }
  double at(size_t i) const {
    const uint32_t bits = static_cast<uint32_t>(w[i]) << 16;
    float f;
    __builtin_memcpy(&f, &bits, sizeof f);
    return static_cast<double>(f);
  }
  void prefetch(size_t i) const { _mm_prefetch(reinterpret_cast<const char*>(w + i), _MM_HINT_T0); }
};

// Lane j of v_m is a[4m+j]: (v0+v1)+(v2+v3) lanewise gives b_j, then (b0+b1)+(b2+b3).
[[gnu::always_inline]] inline double reduce16(const __m256d v[4]) {
  const __m256d b = _mm256_add_pd(_mm256_add_pd(v[0], v[1]), _mm256_add_pd(v[2], v[3]));
  const __m128d lo = _mm256_castpd256_pd128(b);
  const __m128d hi = _mm256_extractf128_pd(b, 1);
  return (_mm_cvtsd_f64(lo) + _mm_cvtsd_f64(_mm_unpackhi_pd(lo, lo))) +
         (_mm_cvtsd_f64(hi) + _mm_cvtsd_f64(_mm_unpackhi_pd(hi, hi)));
}

// NR rows against one input; independent accumulators interleave the FMA chains.
template <int NR, class Load>
void dense_rows(const Load* rows, size_t n, const double* x, float* out) {
  __m256d a[NR][4];
#pragma GCC unroll 8
  for (int r = 0; r < NR; ++r) {
#pragma GCC unroll 8
    for (int m = 0; m < 4; ++m) a[r][m] = _mm256_setzero_pd();
  }
  const size_t full = n / 16 * 16;
  for (size_t i = 0; i < full; i += 16) {
    __m256d xv[4];
#pragma GCC unroll 8
    for (int m = 0; m < 4; ++m) xv[m] = _mm256_loadu_pd(x + i + 4 * m);
#pragma GCC unroll 8
    for (int r = 0; r < NR; ++r) {
      __m256d w[4];
      rows[r].prefetch(i + kPrefetchAhead);
      rows[r](i, w);
#pragma GCC unroll 8
      for (int m = 0; m < 4; ++m) a[r][m] = _mm256_fmadd_pd(w[m], xv[m], a[r][m]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < NR; ++r) {
    double acc = reduce16(a[r]);
    for (size_t i = full; i < n; ++i) acc = acc + rows[r].at(i) * x[i];  // exact product: = fma64
    out[r] = static_cast<float>(acc);
  }
}

// One row against NT inputs: the weights are widened once per block for all tokens.
template <int NT, class Load>
void dense_tokens(const Load& row, size_t n, const double* x, size_t x_stride, float* y, size_t y_stride) {
  __m256d a[NT][4];
#pragma GCC unroll 8
  for (int t = 0; t < NT; ++t) {
#pragma GCC unroll 8
    for (int m = 0; m < 4; ++m) a[t][m] = _mm256_setzero_pd();
  }
  const size_t full = n / 16 * 16;
  for (size_t i = 0; i < full; i += 16) {
    __m256d w[4];
    row(i, w);
#pragma GCC unroll 8
    for (int t = 0; t < NT; ++t) {
#pragma GCC unroll 8
      for (int m = 0; m < 4; ++m) {
        a[t][m] = _mm256_fmadd_pd(w[m], _mm256_loadu_pd(x + t * x_stride + i + 4 * m), a[t][m]);
      }
    }
  }
#pragma GCC unroll 8
  for (int t = 0; t < NT; ++t) {
    double acc = reduce16(a[t]);
    for (size_t i = full; i < n; ++i) acc = acc + row.at(i) * x[t * x_stride + i];
    y[t * y_stride] = static_cast<float>(acc);
  }
}

template <class T, class Load>
void dense(const T* w, size_t rows, size_t cols, const double* x, size_t tokens, float* y, size_t y_stride) {
  if (tokens == 1) {
    size_t r = 0;
    for (; r + 2 <= rows; r += 2) {
      const Load l[2] = {{w + r * cols}, {w + (r + 1) * cols}};
      dense_rows<2>(l, cols, x, y + r);
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
    for (; t + 2 <= tokens; t += 2)
      dense_tokens<2>(l, cols, x + t * cols, cols, y + t * y_stride + r, y_stride);
    for (; t < tokens; ++t) dense_tokens<1>(l, cols, x + t * cols, cols, y + t * y_stride + r, y_stride);
  }
}

void f32_rows(const float* w, size_t rows, size_t cols, const double* x, size_t tokens, float* y,
              size_t y_stride) {
  dense<float, F32Load>(w, rows, cols, x, tokens, y, y_stride);
}

void bf16_rows(const uint16_t* w, size_t rows, size_t cols, const double* x, size_t tokens, float* y,
               size_t y_stride) {
  dense<uint16_t, Bf16Load>(w, rows, cols, x, tokens, y, y_stride);
}

// ---- MXFP4 ----------------------------------------------------------------------------------

constexpr size_t G = 32;

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

// The fast path feeds the integers 2*E2M1 and multiplies the group by scale/2: doubling and
// halving are exact in f64, so the bits equal the plain form. Nibble 8 (-0) becomes +0, harmless
// because every lane starts at +0 and never becomes -0.
struct Group {
  __m256d w[8];  // chunk c = elements 4c .. 4c+3
};

[[gnu::always_inline]] inline Group decode(const uint8_t* bytes) {
  const __m128i lut = _mm_setr_epi8(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12);
  const __m128i mask = _mm_set1_epi8(0x0F);
  const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(bytes));
  const __m128i lo = _mm_and_si128(b, mask);
  const __m128i hi = _mm_and_si128(_mm_srli_epi16(b, 4), mask);
  const __m128i v0 = _mm_shuffle_epi8(lut, _mm_unpacklo_epi8(lo, hi));  // elements 0..15, low nibble = even
  const __m128i v1 = _mm_shuffle_epi8(lut, _mm_unpackhi_epi8(lo, hi));  // elements 16..31
  Group g;
  const __m128i q[4] = {v0, _mm_srli_si128(v0, 8), v1, _mm_srli_si128(v1, 8)};
#pragma GCC unroll 8
  for (int h = 0; h < 4; ++h) {
    const __m256i i32 = _mm256_cvtepi8_epi32(q[h]);  // 8 elements
    g.w[2 * h] = _mm256_cvtepi32_pd(_mm256_castsi256_si128(i32));
    g.w[2 * h + 1] = _mm256_cvtepi32_pd(_mm256_extracti128_si256(i32, 1));
  }
  return g;
}

// v0 takes elements 0-3, 8-11, 16-19, 24-27 and v1 the others, so lane j of v0 is s_j and of v1
// is s_{j+4}; t = v0 + v1 = s_j + s_{j+4}.
[[gnu::always_inline]] inline __m256d group_partial(const Group& g, const double* x) {
  __m256d v0 = _mm256_fmadd_pd(g.w[0], _mm256_loadu_pd(x), _mm256_setzero_pd());
  __m256d v1 = _mm256_fmadd_pd(g.w[1], _mm256_loadu_pd(x + 4), _mm256_setzero_pd());
#pragma GCC unroll 8
  for (int c = 1; c < 4; ++c) {
    v0 = _mm256_fmadd_pd(g.w[2 * c], _mm256_loadu_pd(x + 8 * c), v0);
    v1 = _mm256_fmadd_pd(g.w[2 * c + 1], _mm256_loadu_pd(x + 8 * c + 4), v1);
  }
  return _mm256_add_pd(v0, v1);
}

// Four groups' t vectors -> their subs (t0+t1)+(t2+t3), one per lane, in group order.
[[gnu::always_inline]] inline __m256d subs4(__m256d t0, __m256d t1, __m256d t2, __m256d t3) {
  const __m256d h01 = _mm256_hadd_pd(t0, t1);
  const __m256d h23 = _mm256_hadd_pd(t2, t3);
  return _mm256_add_pd(_mm256_permute2f128_pd(h01, h23, 0x20), _mm256_permute2f128_pd(h01, h23, 0x31));
}

[[gnu::always_inline]] inline double sub1(__m256d t) {
  const __m128d lo = _mm256_castpd256_pd128(t);
  const __m128d hi = _mm256_extractf128_pd(t, 1);
  return (_mm_cvtsd_f64(lo) + _mm_cvtsd_f64(_mm_unpackhi_pd(lo, lo))) +
         (_mm_cvtsd_f64(hi) + _mm_cvtsd_f64(_mm_unpackhi_pd(hi, hi)));
}

// Half-scales of four groups as f64, and a lane mask that is all-ones where the byte is not 255.
[[gnu::always_inline]] inline __m256d half_scales4(const uint8_t* s, __m256d& keep) {
  uint32_t raw;
  __builtin_memcpy(&raw, s, 4);
  const __m256i b = _mm256_cvtepu8_epi64(_mm_cvtsi32_si128(static_cast<int>(raw)));
  keep = _mm256_castsi256_pd(
      _mm256_xor_si256(_mm256_cmpeq_epi64(b, _mm256_set1_epi64x(255)), _mm256_set1_epi64x(-1)));
  return _mm256_castsi256_pd(_mm256_slli_epi64(_mm256_add_epi64(b, _mm256_set1_epi64x(895)), 52));
}

// acc + p0 + p1 + p2 + p3 in order (a skipped group's lane is +0; acc is never -0, so adding +0
// leaves it unchanged, exactly like skipping).
[[gnu::always_inline]] inline double add4(double acc, __m256d p) {
  const __m128d lo = _mm256_castpd256_pd128(p);
  const __m128d hi = _mm256_extractf128_pd(p, 1);
  acc = acc + _mm_cvtsd_f64(lo);
  acc = acc + _mm_cvtsd_f64(_mm_unpackhi_pd(lo, lo));
  acc = acc + _mm_cvtsd_f64(hi);
  acc = acc + _mm_cvtsd_f64(_mm_unpackhi_pd(hi, hi));
  return acc;
}

template <int NT>
void mxfp4_row(const uint8_t* packed, const uint8_t* scales, size_t cols, const double* x, float* y,
               size_t y_stride) {
  const size_t groups = (cols + G - 1) / G;
  const size_t full = cols / G;
  double acc[NT];
#pragma GCC unroll 8
  for (int t = 0; t < NT; ++t) acc[t] = 0.0;
  size_t g = 0;
  for (; g + 4 <= full; g += 4) {
    __m256d keep;
    const __m256d hs = half_scales4(scales + g, keep);
    __m256d tv[NT][4];
#pragma GCC unroll 8
    for (int k = 0; k < 4; ++k) {
      // A skipped group's lanes are computed (the inputs may hold inf / NaN) but masked out below.
      const Group w = decode(packed + (g + k) * G / 2);
#pragma GCC unroll 8
      for (int t = 0; t < NT; ++t) tv[t][k] = group_partial(w, x + t * cols + (g + k) * G);
    }
#pragma GCC unroll 8
    for (int t = 0; t < NT; ++t) {
      const __m256d prod = _mm256_mul_pd(subs4(tv[t][0], tv[t][1], tv[t][2], tv[t][3]), hs);
      acc[t] = add4(acc[t], _mm256_and_pd(prod, keep));  // separate multiply, then add
    }
  }
  for (; g < groups; ++g) {
    if (scales[g] == 255) continue;
    const double s = e8m0(scales[g]);
    if (g < full) {
      const Group w = decode(packed + g * G / 2);
#pragma GCC unroll 8
      for (int t = 0; t < NT; ++t) {
        acc[t] = acc[t] + sub1(group_partial(w, x + t * cols + g * G)) * (s * 0.5);
      }
    } else {
#pragma GCC unroll 8
      for (int t = 0; t < NT; ++t) {
        acc[t] = acc[t] + group_generic(packed + g * G / 2, cols - g * G, x + t * cols + g * G) * s;
      }
    }
  }
#pragma GCC unroll 8
  for (int t = 0; t < NT; ++t) y[t * y_stride] = static_cast<float>(acc[t]);
}

void mxfp4_rows(const uint8_t* packed, const uint8_t* scales, size_t rows, size_t cols, const double* x,
                size_t tokens, float* y, size_t y_stride) {
  const size_t pc = (cols + 1) / 2, sc = (cols + G - 1) / G;
  for (size_t r = 0; r < rows; ++r) {
    size_t t = 0;
    for (; t + 2 <= tokens; t += 2) {
      mxfp4_row<2>(packed + r * pc, scales + r * sc, cols, x + t * cols, y + t * y_stride + r, y_stride);
    }
    for (; t < tokens; ++t) {
      mxfp4_row<1>(packed + r * pc, scales + r * sc, cols, x + t * cols, y + t * y_stride + r, y_stride);
    }
  }
}

}  // namespace

MatmulBodies matmul_bodies_avx2() {
  return {f32_rows, bf16_rows, mxfp4_rows, nullptr};
}

}  // namespace k3::kernels::detail
