// The fused exp3 matmul body (docs/codec.md, "Fused exp3 body"): the rows of a coded exp3 matrix
// straight from the stored blocks (kernels::Exp3Block views), AVX-512BW + VBMI2. For each block of
// rows, every row's next column chunk (kChunk values) is decoded into an L1 buffer -- a group of 64
// values a step: the three code planes are the byte lanes' masks (three masked adds build the
// exponents), the group's escapes are expanded into their lanes from the escape list in one
// vpexpandb -- and the bf16 FMA body runs over the chunk with its accumulators carried to the next
// chunk. A row is cut only at multiples of 16 of its own columns, so every §5.3 lane receives the
// same products in the same order as the Bf16Matrix body (P = a0-3, a8-11, Q = a4-7, a12-15, then
// reduce_pq and the sequential tail): the bits are Bf16Matrix's. Raw pointers and internal-linkage
// helpers only (see matmul_bodies.hpp); this file alone is compiled with -mavx512vbmi2.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#include <immintrin.h>

#include <cstddef>
#include <cstdint>

#include "kernels/matmul_bodies.hpp"
#include "kernels/weights.hpp"

namespace k3::kernels::detail {

namespace {

constexpr size_t kGroup = 64;                 // values per code group (three plane words)
constexpr size_t kGroupBytes = 24;            // the group's plane words
constexpr size_t kChunk = 512;                // row values decoded per row and step (a multiple of 64)
constexpr size_t kBuf = kChunk + 2 * kGroup;  // a chunk widened to whole groups at both ends
constexpr size_t kMaxTokens = 8;              // tokens per pass over the rows (more: another pass)
constexpr size_t kAheadChunks = 2;            // the first block of rows: prefetch distance in chunks

size_t min_size(size_t a, size_t b) {
  return a < b ? a : b;
}

uint64_t load_u64(const uint8_t* p) {
  uint64_t v;
  __builtin_memcpy(&v, p, 8);
  return v;
}

// A row's decode position: the block holding its next value, and the escapes before two groups
// of it (the next group to decode and the last one decoded: a chunk that starts inside a group
// decodes that group again).
struct Cursor {
  const Exp3Block* blk = nullptr;
  size_t g_next = 0, k_next = 0;
  size_t g_last = ~size_t{0}, k_last = 0;
};

// The escapes of groups [0, g) of a coded block.
size_t escapes_before(const Exp3Block& b, size_t g) {
  size_t k = 0;
  for (size_t i = 0; i < g; ++i) {
    const uint8_t* c = b.planes + i * kGroupBytes;
    k += size_t(__builtin_popcountll(load_u64(c) & load_u64(c + 8) & load_u64(c + 16)));
  }
  return k;
}

// Groups [g0, g1) of coded block b into out (64 values a group), k = the escapes before g0. false
// when the escapes would run past the block's list (a malformed block: never read out of bounds).
bool combine(const Exp3Block& b, size_t g0, size_t g1, size_t k, uint16_t* out, Cursor& cur) {
  const __m512i vbase = _mm512_set1_epi8(static_cast<char>(b.base));
  const __m512i one = _mm512_set1_epi8(1), two = _mm512_set1_epi8(2), four = _mm512_set1_epi8(4);
  const __m512i m807f = _mm512_set1_epi16(static_cast<short>(0x807F));
  const size_t full = b.n / kGroup;  // whole groups; a last partial group's values are masked
  for (size_t g = g0; g < g1; ++g) {
    const uint8_t* sm = b.sm + g * kGroup;
    const uint8_t* pl = b.planes + g * kGroupBytes;
    const uint64_t p0 = load_u64(pl), p1 = load_u64(pl + 8), p2 = load_u64(pl + 16);
    const uint64_t valid = g < full ? ~uint64_t{0} : (uint64_t{1} << (b.n % kGroup)) - 1;
    const uint64_t esc = p0 & p1 & p2 & valid;
    const size_t n_esc = size_t(__builtin_popcountll(esc));
    if (k + n_esc > b.n_esc) return false;
    __m512i e = _mm512_mask_add_epi8(vbase, _cvtu64_mask64(p0), vbase, one);
    e = _mm512_mask_add_epi8(e, _cvtu64_mask64(p1), e, two);
    e = _mm512_mask_add_epi8(e, _cvtu64_mask64(p2), e, four);
    e = _mm512_mask_expandloadu_epi8(e, _cvtu64_mask64(esc), b.esc + k);  // the escapes, in order
    cur.g_last = g;
    cur.k_last = k;
    k += n_esc;
    const __m512i s = g < full ? _mm512_loadu_si512(sm) : _mm512_maskz_loadu_epi8(_cvtu64_mask64(valid), sm);
    uint16_t* o = out + (g - g0) * kGroup;
    // bf16 = (sign-extended sm & 0x807F) | e << 7, 32 values at a time
    const __m512i lo = _mm512_ternarylogic_epi32(
        _mm512_cvtepi8_epi16(_mm512_castsi512_si256(s)), m807f,
        _mm512_slli_epi16(_mm512_cvtepu8_epi16(_mm512_castsi512_si256(e)), 7), 0xEA);
    const __m512i hi = _mm512_ternarylogic_epi32(
        _mm512_cvtepi8_epi16(_mm512_extracti64x4_epi64(s, 1)), m807f,
        _mm512_slli_epi16(_mm512_cvtepu8_epi16(_mm512_extracti64x4_epi64(e, 1)), 7), 0xEA);
    _mm512_storeu_si512(o, lo);
    _mm512_storeu_si512(o + 32, hi);
  }
  cur.g_next = g1;
  cur.k_next = k;
  return true;
}

// Values [lo, hi) of the array into out, value v at out[v - (lo & ~63)] (whole groups are decoded,
// so up to 63 values on either side are written too). The cursor's block holds lo on entry.
bool decode(Cursor& cur, uint64_t lo, uint64_t hi, uint16_t* out) {
  const uint64_t o0 = lo & ~uint64_t{kGroup - 1};
  while (lo < hi) {
    while (lo >= cur.blk->first + cur.blk->n) {
      ++cur.blk;
      cur.g_next = cur.k_next = 0;
      cur.g_last = ~size_t{0};
    }
    const Exp3Block& b = *cur.blk;
    const uint64_t stop = hi < b.first + b.n ? hi : b.first + b.n;
    const size_t i0 = size_t(lo - b.first), i1 = size_t(stop - b.first);
    if (b.raw != nullptr) {
      __builtin_memcpy(out + (lo - o0), b.raw + 2 * i0, 2 * (i1 - i0));
    } else {
      const size_t g0 = i0 / kGroup, g1 = (i1 + kGroup - 1) / kGroup;
      const size_t k = g0 == cur.g_next ? cur.k_next : g0 == cur.g_last ? cur.k_last : escapes_before(b, g0);
      if (!combine(b, g0, g1, k, out + (b.first + g0 * kGroup - o0), cur)) return false;
    }
    lo = stop;
  }
  return true;
}

// Prefetches the stored bytes of values [lo, hi) of the array (sign+mantissa bytes, planes, the
// escape list's line near there; a raw block's values); `blk` follows lo as `Cursor::blk` does.
void prefetch(const Exp3Block*& blk, const Exp3Block* end, uint64_t lo, uint64_t hi) {
  auto line = [](const uint8_t* p) { _mm_prefetch(reinterpret_cast<const char*>(p), _MM_HINT_T0); };
  while (lo < hi) {
    while (blk != end && lo >= blk->first + blk->n) ++blk;
    if (blk == end) return;
    const Exp3Block& b = *blk;
    const uint64_t stop = hi < b.first + b.n ? hi : b.first + b.n;
    const size_t i0 = size_t(lo - b.first), i1 = size_t(stop - b.first);
    if (b.raw != nullptr) {
      for (size_t i = 2 * i0; i < 2 * i1; i += 64) line(b.raw + i);
    } else {
      for (size_t i = i0; i < i1; i += 64) line(b.sm + i);
      for (size_t i = i0 / kGroup * kGroupBytes; i < (i1 + kGroup - 1) / kGroup * kGroupBytes; i += 64)
        line(b.planes + i);
      line(b.esc + size_t(uint64_t(b.n_esc) * i0 / b.n));
    }
    lo = stop;
  }
}

// bf16 widening as the Bf16Matrix body does it (see matmul_avx512.cpp): the sixteen §5.3 lanes are
// held as P = a0-3, a8-11 and Q = a4-7, a12-15, and the tree pairs a_j with a_{j+4} first.
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

double bf16_at(const uint16_t* w, size_t i) {
  const uint32_t bits = static_cast<uint32_t>(w[i]) << 16;
  float f;
  __builtin_memcpy(&f, &bits, sizeof f);
  return static_cast<double>(f);
}

// `steps` blocks of 16 of NR decoded rows against NT inputs (x_stride apart), the accumulators
// acc[r][t0 + t] = {P, Q} loaded before and stored after.
template <int NR, int NT>
[[gnu::always_inline]] inline void fma_chunk(const uint16_t* const* w, size_t steps, const double* x,
                                             size_t x_stride, __m512d (*acc)[kMaxTokens][2], size_t t0) {
  __m512d P[NR][NT], Q[NR][NT];
#pragma GCC unroll 8
  for (int r = 0; r < NR; ++r) {
#pragma GCC unroll 8
    for (int t = 0; t < NT; ++t) P[r][t] = acc[r][t0 + t][0], Q[r][t] = acc[r][t0 + t][1];
  }
  for (size_t s = 0; s < steps; ++s) {
    const size_t i = 16 * s;
    __m512d xp[NT], xq[NT];
#pragma GCC unroll 8
    for (int t = 0; t < NT; ++t) {
      const __m512d X0 = _mm512_loadu_pd(x + t * x_stride + i);
      const __m512d X1 = _mm512_loadu_pd(x + t * x_stride + i + 8);
      xp[t] = _mm512_shuffle_f64x2(X0, X1, 0x44);  // x0-3, x8-11
      xq[t] = _mm512_shuffle_f64x2(X0, X1, 0xEE);  // x4-7, x12-15
    }
#pragma GCC unroll 8
    for (int r = 0; r < NR; ++r) {
      const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w[r] + i));
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
    for (int t = 0; t < NT; ++t) acc[r][t0 + t][0] = P[r][t], acc[r][t0 + t][1] = Q[r][t];
  }
}

const Exp3Block* block_of(const Exp3Block* blocks, size_t n_blocks, uint64_t v) {
  size_t lo = 0, hi = n_blocks;  // the first block ending past v
  while (lo < hi) {
    const size_t mid = (lo + hi) / 2;
    if (blocks[mid].first + blocks[mid].n <= v)
      lo = mid + 1;
    else
      hi = mid;
  }
  return blocks + lo;
}

// NR rows (the first at value row0 of the array) against nt <= kMaxTokens inputs (x rows cols
// apart); y[t * y_stride + r].
// The coded bytes stream from DRAM: while a block of rows computes, each chunk step prefetches the
// same chunk of the next block's rows (`ahead` rows further: a whole block of rows of lead); the
// first block of a call (`cold`) prefetches its own rows kAheadChunks chunks ahead instead.
template <int NR>
bool rows_block(const Exp3Block* blocks, size_t n_blocks, uint64_t row0, size_t cols, const double* x,
                size_t nt, float* y, size_t y_stride, uint64_t end, bool cold) {
  alignas(64) uint16_t buf[NR][kBuf];
  alignas(64) __m512d acc[NR][kMaxTokens][2];
  Cursor cur[NR];
  const Exp3Block* pf_next[NR];
  const Exp3Block* pf_own[NR];
  const Exp3Block* const blocks_end = blocks + n_blocks;
  const uint16_t* w[NR];
  for (int r = 0; r < NR; ++r) {
    cur[r].blk = block_of(blocks, n_blocks, row0 + size_t(r) * cols);
    pf_own[r] = cur[r].blk;
    pf_next[r] = block_of(blocks, n_blocks, min_size(row0 + size_t(r + NR) * cols, end));
    for (size_t t = 0; t < nt; ++t) acc[r][t][0] = acc[r][t][1] = _mm512_setzero_pd();
    if (cold) {
      const uint64_t lo = row0 + size_t(r) * cols;
      prefetch(pf_own[r], blocks_end, lo, lo + min_size(kAheadChunks * kChunk, cols));
    }
  }
  const size_t full = cols / 16 * 16;
  size_t c0 = 0;
  for (;; c0 += kChunk) {
    const size_t c1 = min_size(c0 + kChunk, cols);
    for (int r = 0; r < NR; ++r) {
      const uint64_t lo = row0 + size_t(r) * cols + c0;
      if (cold) {
        const size_t a0 = c0 + kAheadChunks * kChunk;
        if (a0 < cols)
          prefetch(pf_own[r], blocks_end, lo + kAheadChunks * kChunk,
                   lo + min_size(kChunk, cols - a0) + kAheadChunks * kChunk);
      }
      const uint64_t nlo = lo + NR * cols;
      if (nlo < end) prefetch(pf_next[r], blocks_end, nlo, nlo + (c1 - c0) < end ? nlo + (c1 - c0) : end);
      if (!decode(cur[r], lo, lo + (c1 - c0), buf[r])) return false;
      w[r] = buf[r] + (lo & (kGroup - 1));
    }
    const size_t steps = (min_size(c1, full) - c0) / 16;
    if (steps > 0) {
      size_t t = 0;
      if constexpr (NR <= 4) {
        for (; t + 2 <= nt; t += 2) fma_chunk<NR, 2>(w, steps, x + t * cols + c0, cols, acc, t);
      }
      for (; t < nt; ++t) fma_chunk<NR, 1>(w, steps, x + t * cols + c0, cols, acc, t);
    }
    if (c1 == cols) break;
  }
  // The tail [full, cols) lies in the last chunk (c0 <= full: c0 is a multiple of 16).
  for (int r = 0; r < NR; ++r) {
    for (size_t t = 0; t < nt; ++t) {
      double a = reduce_pq(acc[r][t][0], acc[r][t][1]);
      for (size_t i = full; i < cols; ++i) a = a + bf16_at(w[r], i - c0) * x[t * cols + i];
      y[t * y_stride + size_t(r)] = static_cast<float>(a);
    }
  }
  return true;
}

bool exp3_rows(const Exp3Block* blocks, size_t n_blocks, uint64_t first, size_t rows, size_t cols,
               const double* x, size_t tokens, float* y, size_t y_stride) {
  if (cols == 0 || n_blocks == 0) return false;
  for (size_t t = 0; t < tokens; t += kMaxTokens) {
    const size_t nt = min_size(kMaxTokens, tokens - t);
    const double* xt = x + t * cols;
    float* yt = y + t * y_stride;
    const uint64_t end = first + rows * cols;
    size_t r = 0;
    if (nt == 1) {
      for (; r + 8 <= rows; r += 8)
        if (!rows_block<8>(blocks, n_blocks, first + r * cols, cols, xt, nt, yt + r, y_stride, end, r == 0))
          return false;
    }
    for (; r + 4 <= rows; r += 4)
      if (!rows_block<4>(blocks, n_blocks, first + r * cols, cols, xt, nt, yt + r, y_stride, end, r == 0))
        return false;
    for (; r < rows; ++r)
      if (!rows_block<1>(blocks, n_blocks, first + r * cols, cols, xt, nt, yt + r, y_stride, end, r == 0))
        return false;
  }
  return true;
}

}  // namespace

Exp3Rows matmul_exp3_avx512() {
  return exp3_rows;
}

}  // namespace k3::kernels::detail
