// The fused exp3 matmul body (docs/codec.md, "Fused exp3 body"): the rows of a coded exp3 matrix
// straight from the stored blocks (kernels::Exp3Block views), AVX-512BW + VBMI + VBMI2. A group of
// 64 values decodes in a few instructions: the three code planes are the byte lanes' masks (three
// masked adds build the exponents) and the group's escapes are expanded into their lanes from the
// escape list (one vpexpandb). Two ways to feed the FMAs, both bit-identical to the Bf16Matrix
// body (every §5.3 lane receives w[i + l] * x[i + l] block by block in the row's order, then the
// fixed tree and the sequential tail):
// - in registers (one or two inputs, rows of whole groups starting at a multiple of 16: every real
//   tensor): NR rows (6 for one input, 4 for two) walk their groups in lockstep, vpermt2b places
//   each value's two bf16 bytes in the top of an f32 and the quarters go straight to cvtps2pd and
//   the FMAs (lanes A = a0..a7, B = a8..a15);
// - in chunks (anything else, and 3+ inputs so each value is decoded once for all of them): each
//   row's next kChunk values are decoded as bf16 into an L1 buffer and the Bf16Matrix body's
//   arithmetic (P = a0-3, a8-11, Q = a4-7, a12-15) runs over the chunk with its accumulators
//   carried to the next chunk; a row is cut only at multiples of 16 of its own columns.
// Raw pointers and internal-linkage helpers only (see matmul_bodies.hpp); this file alone is
// compiled with -mavx512vbmi -mavx512vbmi2 and runs only where the CPU has both (matmul.cpp).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#include <immintrin.h>

#include <cstddef>
#include <cstdint>

#include "kernels/matmul_avx512_tree.hpp"
#include "kernels/matmul_bodies.hpp"
#include "kernels/weights.hpp"

namespace k3::kernels::detail {

namespace {

constexpr size_t kGroup = 64;                 // values per code group (three plane words)
constexpr size_t kGroupBytes = 24;            // the group's plane words
constexpr size_t kChunk = 512;                // chunk path: values decoded per row and step (x 64)
constexpr size_t kBuf = kChunk + 2 * kGroup;  // a chunk widened to whole groups at both ends
constexpr size_t kMaxTokens = 8;              // tokens per pass over the rows (more: another pass)
constexpr size_t kAheadChunks = 2;            // the first block of rows: prefetch distance in chunks

// vpermt2b indices: dword i of quarter q takes byte L[16q + i] into its byte 2, H[16q + i] into byte 3.
struct F32Index {
  alignas(64) uint8_t t[4][64];
  constexpr F32Index() : t{} {
    for (int q = 0; q < 4; ++q)
      for (int i = 0; i < 16; ++i) {
        t[q][4 * i + 2] = uint8_t(16 * q + i);
        t[q][4 * i + 3] = uint8_t(64 + 16 * q + i);
      }
  }
};
constexpr F32Index kF32IndexTable{};
constexpr const uint8_t (&kF32Index)[4][64] = kF32IndexTable.t;

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

// A group's exponent bytes e (three masked adds of the code planes onto the base, then the escapes
// expanded into their lanes from esc, in order) and its sign+mantissa bytes s. `valid` masks the
// values a last partial group has.
struct GroupCodes {
  __m512i e, s;
};
[[gnu::always_inline]] inline GroupCodes group_codes(const uint8_t* sm, const uint8_t* pl, const uint8_t* esc,
                                                     __m512i vbase, uint64_t valid, bool partial) {
  const __m512i one = _mm512_set1_epi8(1), two = _mm512_set1_epi8(2), four = _mm512_set1_epi8(4);
  const uint64_t p0 = load_u64(pl), p1 = load_u64(pl + 8), p2 = load_u64(pl + 16);
  __m512i e = _mm512_mask_add_epi8(vbase, _cvtu64_mask64(p0), vbase, one);
  e = _mm512_mask_add_epi8(e, _cvtu64_mask64(p1), e, two);
  e = _mm512_mask_add_epi8(e, _cvtu64_mask64(p2), e, four);
  e = _mm512_mask_expandloadu_epi8(e, _cvtu64_mask64(p0 & p1 & p2 & valid), esc);  // the escapes, in order
  return {e, partial ? _mm512_maskz_loadu_epi8(_cvtu64_mask64(valid), sm) : _mm512_loadu_si512(sm)};
}

// The bytes (L, H) = ((e & 1) << 7 | mantissa, sign | e >> 1) of a group's 64 values (bf16 =
// H << 8 | L), from group_codes.
struct GroupBytes {
  __m512i L, H;
};
[[gnu::always_inline]] inline GroupBytes group_bytes(const uint8_t* sm, const uint8_t* pl, const uint8_t* esc,
                                                     __m512i vbase, uint64_t valid, bool partial) {
  const __m512i hi_bit = _mm512_set1_epi8(static_cast<char>(0x80));
  const GroupCodes c = group_codes(sm, pl, esc, vbase, valid, partial);
  const __m512i e = c.e, s = c.s;
  // 16-bit shifts: each byte's own bit lands where the byte mask picks it
  return {_mm512_ternarylogic_epi32(hi_bit, _mm512_slli_epi16(e, 7), s, 0xCA),   // hi_bit ? e<<7 : s
          _mm512_ternarylogic_epi32(hi_bit, s, _mm512_srli_epi16(e, 1), 0xCA)};  // hi_bit ? s : e>>1
}

// Values 16q..16q+15 of a group as f32 (f32 = bf16 << 16): vpermt2b places L, H into bytes 2, 3 of
// each dword and zeroes bytes 0, 1.
[[gnu::always_inline]] inline __m512 quarter_f32(const GroupBytes& v, int q) {
  return _mm512_castsi512_ps(_mm512_maskz_permutex2var_epi8(_cvtu64_mask64(0xCCCCCCCCCCCCCCCCull), v.L,
                                                            _mm512_load_si512(kF32Index[q]), v.H));
}

// One group of 64 values into out as bf16 (the chunk path: bf16 = (sign-extended sm & 0x807F) |
// e << 7, 32 values at a time).
[[gnu::always_inline]] inline void group_bf16(const uint8_t* sm, const uint8_t* pl, const uint8_t* esc,
                                              __m512i vbase, uint64_t valid, bool partial, uint16_t* out) {
  const __m512i m807f = _mm512_set1_epi16(static_cast<short>(0x807F));
  const GroupCodes c = group_codes(sm, pl, esc, vbase, valid, partial);
  const __m512i e = c.e, s = c.s;
  const __m512i lo = _mm512_ternarylogic_epi32(
      _mm512_cvtepi8_epi16(_mm512_castsi512_si256(s)), m807f,
      _mm512_slli_epi16(_mm512_cvtepu8_epi16(_mm512_castsi512_si256(e)), 7), 0xEA);  // (a & b) | c
  const __m512i hi = _mm512_ternarylogic_epi32(
      _mm512_cvtepi8_epi16(_mm512_extracti64x4_epi64(s, 1)), m807f,
      _mm512_slli_epi16(_mm512_cvtepu8_epi16(_mm512_extracti64x4_epi64(e, 1)), 7), 0xEA);
  _mm512_storeu_si512(out, lo);
  _mm512_storeu_si512(out + 32, hi);
}

// Groups [g0, g1) of coded block b into out (64 values a group), k = the escapes before g0.
// false when the escapes would run past the block's list (a malformed block: never read out of
// bounds).
bool combine(const Exp3Block& b, size_t g0, size_t g1, size_t k, uint16_t* out, Cursor& cur) {
  const __m512i vbase = _mm512_set1_epi8(static_cast<char>(b.base));
  const uint8_t* const sm = b.sm;
  const uint8_t* const planes = b.planes;
  const uint8_t* const esc = b.esc;
  const size_t n_esc = b.n_esc, full = b.n / kGroup;
  const size_t g_full = g1 < full ? g1 : full;
  size_t k_last = k, g = g0;
  for (; g < g_full; ++g) {
    const uint8_t* pl = planes + g * kGroupBytes;
    const size_t ne = size_t(__builtin_popcountll(load_u64(pl) & load_u64(pl + 8) & load_u64(pl + 16)));
    if (k + ne > n_esc) return false;
    group_bf16(sm + g * kGroup, pl, esc + k, vbase, ~uint64_t{0}, false, out + (g - g0) * kGroup);
    k_last = k;
    k += ne;
  }
  if (g < g1) {  // the last block's partial group
    const uint8_t* pl = planes + g * kGroupBytes;
    const uint64_t valid = (uint64_t{1} << (b.n % kGroup)) - 1;
    const size_t ne =
        size_t(__builtin_popcountll(load_u64(pl) & load_u64(pl + 8) & load_u64(pl + 16) & valid));
    if (k + ne > n_esc) return false;
    group_bf16(sm + g * kGroup, pl, esc + k, vbase, valid, true, out + (g - g0) * kGroup);
    k_last = k;
    k += ne;
  }
  cur.g_last = g1 - 1;
  cur.k_last = k_last;
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

// About where the escapes of block b's value i are in its list (escapes spread evenly; a block
// that is not a power of two long, only a stream's last, is over-estimated up to twice).
[[gnu::always_inline]] inline const uint8_t* esc_near(const Exp3Block& b, size_t i) {
  return b.esc + ((uint64_t{b.n_esc} * i) >> (63 - __builtin_clzll(b.n)));
}

// Prefetches the stored bytes of values [lo, lo + kChunk) of the array: the sign+mantissa bytes and
// planes of the block holding lo (what runs past its end is the next chunk's), and the escape
// list's lines about there; a raw block's values. `blk` follows lo as
// Cursor::blk does.
[[gnu::noinline]] void prefetch_chunk(const Exp3Block*& blk, const Exp3Block* end, uint64_t lo) {
  while (blk != end && lo >= blk->first + blk->n) ++blk;
  if (blk == end) return;
  auto line = [](const uint8_t* p) { _mm_prefetch(reinterpret_cast<const char*>(p), _MM_HINT_T0); };
  const size_t i0 = size_t(lo - blk->first);
  if (blk->raw != nullptr) {
#pragma GCC unroll 16
    for (size_t i = 0; i < 2 * kChunk; i += 64) line(blk->raw + 2 * i0 + i);
    return;
  }
#pragma GCC unroll 8
  for (size_t i = 0; i < kChunk; i += 64) line(blk->sm + i0 + i);
  const uint8_t* pl = blk->planes + i0 / kGroup * kGroupBytes;
#pragma GCC unroll 4
  for (size_t i = 0; i < kChunk / kGroup * kGroupBytes; i += 64) line(pl + i);
  for (const uint8_t *e = esc_near(*blk, i0), *e1 = esc_near(*blk, i0 + kChunk); e <= e1; e += 64) line(e);
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

// NR rows (the first at value row0 of the array, the call's rows ending at value `end`) against
// nt <= kMaxTokens inputs (x rows cols apart); y[t * y_stride + r]. The coded bytes stream from
// DRAM: each chunk step prefetches the same chunk of the next NR rows (a whole block of rows of
// lead); the call's first block of rows (`cold`) also prefetches its own rows kAheadChunks chunks
// ahead.
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
    if (cold)
      for (size_t c = 0; c < kAheadChunks * kChunk && c < cols; c += kChunk)
        prefetch_chunk(pf_own[r], blocks_end, row0 + size_t(r) * cols + c);
  }
  const size_t full = cols / 16 * 16;
  size_t c0 = 0;
  for (;; c0 += kChunk) {
    const size_t c1 = min_size(c0 + kChunk, cols);
    for (int r = 0; r < NR; ++r) {
      const uint64_t lo = row0 + size_t(r) * cols + c0;
      if (cold && c0 + kAheadChunks * kChunk < cols)
        prefetch_chunk(pf_own[r], blocks_end, lo + kAheadChunks * kChunk);
      const uint64_t nlo = lo + NR * cols;
      if (nlo < end) prefetch_chunk(pf_next[r], blocks_end, nlo);
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

// ---- one token, aligned rows: decoded in registers -------------------------------------------
//
// When cols is a multiple of 64 and the matrix starts at a multiple of 16, every row starts at the
// same phase p (a multiple of 16) inside a code group, and row step s (its values 16s..16s+15) is
// quarter (p / 16 + s) % 4 of a group. NR rows then walk their groups in lockstep: each group is
// decoded into registers and its quarters go straight into cvtps2pd and the FMAs (no buffer). The
// lanes are the natural ones (A = a0..a7, B = a8..a15), fed block by block in row order.

constexpr size_t kAheadInRow = 256;  // prefetch distance in sign+mantissa bytes (best measured)

// Prefetches the first kAheadInRow values' bytes of group g of block b onwards (what a row about to
// enter there reads first).
[[gnu::always_inline]] inline void prefetch_start(const Exp3Block& b, size_t g) {
  for (size_t i = 0; i < kAheadInRow; i += 64)
    _mm_prefetch(reinterpret_cast<const char*>(b.sm + g * kGroup + i), _MM_HINT_T0);
  _mm_prefetch(reinterpret_cast<const char*>(b.planes + g * kGroupBytes), _MM_HINT_T0);
  _mm_prefetch(reinterpret_cast<const char*>(b.planes + g * kGroupBytes + 64), _MM_HINT_T0);
  _mm_prefetch(reinterpret_cast<const char*>(esc_near(b, g * kGroup)), _MM_HINT_T0);
}

// A row's place: its block, the group inside it, the escapes before that group.
struct RowPos {
  const Exp3Block* b;
  size_t g, k;
};

// A row inside one block for a segment: the segment's first group (sign+mantissa bytes, planes),
// its next escape, the list's end (the escapes must stay under it), the block's base.
struct SegRow {
  const uint8_t *sm, *pl, *esc, *esc_end;
  uint8_t base;
};

SegRow seg_row(const RowPos& rp) {
  const Exp3Block& b = *rp.b;
  return {b.sm + rp.g * kGroup, b.planes + rp.g * kGroupBytes, b.esc + rp.k, b.esc + b.n_esc, b.base};
}

// Group j of the segment as L, H bytes (prefetching kAheadInRow values ahead), its escapes
// consumed. false: malformed (its escapes run past the block's list).
[[gnu::always_inline]] inline bool seg_group(SegRow& sr, size_t j, GroupBytes& v) {
  const uint8_t* sm = sr.sm + j * kGroup;
  const uint8_t* pl = sr.pl + j * kGroupBytes;
  _mm_prefetch(reinterpret_cast<const char*>(sm + kAheadInRow), _MM_HINT_T0);
  _mm_prefetch(reinterpret_cast<const char*>(pl + kAheadInRow * 3 / 8), _MM_HINT_T0);
  _mm_prefetch(reinterpret_cast<const char*>(sr.esc + 64), _MM_HINT_T0);  // ~40 groups' escapes a line
  const size_t ne = size_t(__builtin_popcountll(load_u64(pl) & load_u64(pl + 8) & load_u64(pl + 16)));
  if (sr.esc + ne > sr.esc_end) return false;
  v = group_bytes(sm, pl, sr.esc, _mm512_set1_epi8(static_cast<char>(sr.base)), ~uint64_t{0}, false);
  sr.esc += ne;
  return true;
}

// Moves the row n groups on (n <= the groups left in its block, escapes now at esc); into the next
// block when it gets to the end, prefetching the start of the block after that one.
[[gnu::always_inline]] inline void row_advance(RowPos& rp, size_t n, const uint8_t* esc,
                                               const Exp3Block* end) {
  rp.g += n;
  rp.k = size_t(esc - rp.b->esc);
  if (rp.g == rp.b->n / kGroup) {
    ++rp.b;
    rp.g = rp.k = 0;
    if (rp.b + 1 < end) prefetch_start(rp.b[1], 0);
  }
}

// Quarter q of a decoded group (16 of the row's values) into the accumulators of NT inputs, x of
// input t at xq + t * x_stride.
template <int NT>
[[gnu::always_inline]] inline void fma_quarter(const GroupBytes& v, int q, const double* xq, size_t x_stride,
                                               __m512d* A, __m512d* B) {
  const __m512 f = quarter_f32(v, q);
  const __m512d lo = _mm512_cvtps_pd(_mm512_castps512_ps256(f)),
                hi = _mm512_cvtps_pd(_mm512_extractf32x8_ps(f, 1));
#pragma GCC unroll 2
  for (int t = 0; t < NT; ++t) {
    A[t] = _mm512_fmadd_pd(lo, _mm512_loadu_pd(xq + t * x_stride), A[t]);
    B[t] = _mm512_fmadd_pd(hi, _mm512_loadu_pd(xq + t * x_stride + 8), B[t]);
  }
}

// A row's first or last group, cut by the row's edge: quarters [q0, q1) only, x of quarter q0 at
// xq0.
template <int NT>
[[gnu::noinline]] bool edge_group(RowPos& rp, const Exp3Block* end, int q0, int q1, const double* xq0,
                                  size_t x_stride, __m512d* A, __m512d* B) {
  SegRow sr = seg_row(rp);
  GroupBytes v;
  if (!seg_group(sr, 0, v)) return false;
  for (int q = q0; q < q1; ++q) fma_quarter<NT>(v, q, xq0 + 16 * (q - q0), x_stride, A, B);
  row_advance(rp, 1, sr.esc, end);
  return true;
}

// NR rows from value row0 (phase p = row0 % 64, a multiple of 16; cols % 64 == 0; no raw block)
// against NT inputs (x rows cols apart); y[t * y_stride + r]. The call's rows end at value `end`.
// The rows walk their groups in segments in which none of them crosses a block edge, so one group
// counter serves all of them (measured ~15 % faster than each row checking its own edge).
template <int NR, int NT>
bool rows_inreg(const Exp3Block* blocks, size_t n_blocks, uint64_t row0, size_t cols, const double* x,
                float* y, size_t y_stride, uint64_t end) {
  const Exp3Block* const blocks_end = blocks + n_blocks;
  RowPos rp[NR];
  __m512d A[NR][NT], B[NR][NT];
  const size_t p = size_t(row0 % kGroup);
  for (int r = 0; r < NR; ++r) {
    const uint64_t v = row0 + size_t(r) * cols;
    rp[r].b = block_of(blocks, n_blocks, v);
    rp[r].g = size_t(v - rp[r].b->first) / kGroup;
    rp[r].k = escapes_before(*rp[r].b, rp[r].g);
    prefetch_start(*rp[r].b, rp[r].g);
    if (rp[r].b + 1 < blocks_end) prefetch_start(rp[r].b[1], 0);
    for (int t = 0; t < NT; ++t) A[r][t] = B[r][t] = _mm512_setzero_pd();
  }
  // Row-relative groups G = 0..n_g-1 cover row values [64G - p, 64G - p + 64): quarter q of G is
  // the row's step (64G + 16q - p) / 16 where that lies inside the row (its x: x + 64G + 16q - p).
  const size_t n_g = cols / kGroup + (p != 0);
  size_t G = 0;
  if (p != 0) {
    for (int r = 0; r < NR; ++r)
      if (!edge_group<NT>(rp[r], blocks_end, int(p / 16), 4, x, cols, A[r], B[r])) return false;
    G = 1;
  }
  const size_t G_end = p != 0 ? n_g - 1 : n_g;
  bool next_fetched = false;  // the next NR rows' first bytes, prefetched halfway
  while (G < G_end) {
    size_t seg = G_end - G;
    for (int r = 0; r < NR; ++r) seg = min_size(seg, rp[r].b->n / kGroup - rp[r].g);
    if (!next_fetched && G + seg > (G_end + G) / 2) {
      next_fetched = true;
      for (int r = 0; r < NR; ++r) {
        const uint64_t v = row0 + size_t(r + NR) * cols;
        if (v >= end) break;
        const Exp3Block* b = block_of(blocks, n_blocks, v);
        prefetch_start(*b, size_t(v - b->first) / kGroup);
      }
    }
    SegRow sr[NR];
    for (int r = 0; r < NR; ++r) sr[r] = seg_row(rp[r]);
    for (size_t j = 0; j < seg; ++j) {
      const double* xg = x + ((G + j) * kGroup - p);
#pragma GCC unroll 8
      for (int r = 0; r < NR; ++r) {
        GroupBytes v;
        if (!seg_group(sr[r], j, v)) return false;
#pragma GCC unroll 4
        for (int q = 0; q < 4; ++q) fma_quarter<NT>(v, q, xg + 16 * q, cols, A[r], B[r]);
      }
    }
    for (int r = 0; r < NR; ++r) row_advance(rp[r], seg, sr[r].esc, blocks_end);
    G += seg;
  }
  if (p != 0) {
    for (int r = 0; r < NR; ++r)
      if (!edge_group<NT>(rp[r], blocks_end, 0, int(p / 16), x + (G * kGroup - p), cols, A[r], B[r]))
        return false;
  }
#pragma GCC unroll 8
  for (int r = 0; r < NR; ++r) {
#pragma GCC unroll 2
    for (int t = 0; t < NT; ++t)
      y[size_t(t) * y_stride + size_t(r)] = static_cast<float>(reduce16(A[r][t], B[r][t]));
  }
  return true;
}

// Whether rows_inreg takes rows [first, end) of cols values: widths of whole groups, a start at a
// multiple of 16, all blocks coded (raw blocks: the chunk path), and the rows' groups whole (only
// a stream's last block can end inside a group).
bool inreg_fits(const Exp3Block* blocks, size_t n_blocks, uint64_t first, uint64_t end, size_t cols) {
  const Exp3Block& last = blocks[n_blocks - 1];
  if (cols % kGroup != 0 || first % 16 != 0 || end > last.first + last.n / kGroup * kGroup) return false;
  for (size_t i = 0; i < n_blocks; ++i)
    if (blocks[i].raw != nullptr) return false;
  return true;
}

bool exp3_rows(const Exp3Block* blocks, size_t n_blocks, uint64_t first, size_t rows, size_t cols,
               const double* x, size_t tokens, float* y, size_t y_stride) {
  if (cols == 0 || n_blocks == 0) return false;
  // One or two inputs, rows of whole groups: decoded in registers. More inputs: the chunk path
  // (each chunk decoded once for all of them).
  if (const uint64_t end = first + rows * cols;
      tokens <= 2 && inreg_fits(blocks, n_blocks, first, end, cols)) {
    size_t r = 0;
    if (tokens == 1) {  // six rows in flight: measured ~7 % faster from DRAM than eight (which spill)
      for (; r + 6 <= rows; r += 6)
        if (!rows_inreg<6, 1>(blocks, n_blocks, first + r * cols, cols, x, y + r, y_stride, end))
          return false;
      for (; r + 4 <= rows; r += 4)
        if (!rows_inreg<4, 1>(blocks, n_blocks, first + r * cols, cols, x, y + r, y_stride, end))
          return false;
      for (; r + 2 <= rows; r += 2)
        if (!rows_inreg<2, 1>(blocks, n_blocks, first + r * cols, cols, x, y + r, y_stride, end))
          return false;
      for (; r < rows; ++r)
        if (!rows_inreg<1, 1>(blocks, n_blocks, first + r * cols, cols, x, y + r, y_stride, end))
          return false;
    } else {
      for (; r + 4 <= rows; r += 4)
        if (!rows_inreg<4, 2>(blocks, n_blocks, first + r * cols, cols, x, y + r, y_stride, end))
          return false;
      for (; r < rows; ++r)
        if (!rows_inreg<1, 2>(blocks, n_blocks, first + r * cols, cols, x, y + r, y_stride, end))
          return false;
    }
    return true;
  }
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
