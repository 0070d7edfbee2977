// exp4 combine, AVX-512BW: 32 values a step, 16-bit lanes. Bit-identical to exp4_combine_scalar.
#include <immintrin.h>

#include "io/codec/blocks.hpp"

namespace k3::io::codec::detail {

namespace {
// Values to prefetch ahead: 8 KiB of sign+mantissa bytes and 4 KiB of offsets, over a block ahead
// (a one-core fused matvec over 64 MiB: 1 KiB ahead ~9, 8 KiB ~12 GB/s; the plain matvec ~21).
constexpr size_t kAhead = 8192;
}  // namespace

void exp4_combine_avx512(const uint8_t* sm, const uint8_t* nib, uint8_t base, size_t n, uint16_t* out) {
  const __m256i lo4 = _mm256_set1_epi16(0x000F), hi4 = _mm256_set1_epi16(0x00F0);
  const __m256i vbase = _mm256_set1_epi8(static_cast<char>(base));
  const __m512i s80 = _mm512_set1_epi16(0x0080), m7f = _mm512_set1_epi16(0x007F);
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    // The coded bytes stream from DRAM (a fused matvec's tile is in L2, but its input is not):
    // without prefetching ahead the loop waits on them and runs at a quarter of its in-cache rate.
    _mm_prefetch(reinterpret_cast<const char*>(sm + i + kAhead), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(nib + i / 2 + kAhead / 2), _MM_HINT_T0);
    // 16 nibble bytes -> 16 u16 lanes (lo nibble | hi nibble << 8) = 32 offset bytes in order.
    const __m256i x = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(nib + i / 2)));
    const __m256i offs =
        _mm256_or_si256(_mm256_and_si256(x, lo4), _mm256_slli_epi16(_mm256_and_si256(x, hi4), 4));
    const __m512i e = _mm512_cvtepu8_epi16(_mm256_add_epi8(offs, vbase));
    const __m512i m = _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(sm + i)));
    // (m & 0x80) << 8 | e << 7 | (m & 0x7F)
    const __m512i v = _mm512_ternarylogic_epi32(_mm512_slli_epi16(_mm512_and_si512(m, s80), 8),
                                                _mm512_slli_epi16(e, 7), _mm512_and_si512(m, m7f), 0xFE);
    _mm512_storeu_si512(out + i, v);
  }
  exp4_combine_scalar(sm + i, nib + i / 2, base, n - i, out + i);
}

}  // namespace k3::io::codec::detail
