// exp4 combine, AVX2: 32 values a step. Bit-identical to exp4_combine_scalar.
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "io/codec/blocks.hpp"

namespace k3::io::codec::detail {

void exp4_combine_avx2(const uint8_t* sm, const uint8_t* nib, uint8_t base, size_t n, uint16_t* out) {
  const __m256i lo4 = _mm256_set1_epi16(0x000F), hi4 = _mm256_set1_epi16(0x00F0);
  const __m256i vbase = _mm256_set1_epi8(static_cast<char>(base));
  const __m256i s80 = _mm256_set1_epi16(0x0080), m7f = _mm256_set1_epi16(0x007F);
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    // 16 nibble bytes -> 16 u16 lanes (lo nibble | hi nibble << 8) = 32 offsets in order.
    const __m256i x = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(nib + i / 2)));
    const __m256i offs =
        _mm256_or_si256(_mm256_and_si256(x, lo4), _mm256_slli_epi16(_mm256_and_si256(x, hi4), 4));
    const __m256i exps = _mm256_add_epi8(offs, vbase);
    const __m256i s = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(sm + i));
    for (int h = 0; h < 2; ++h) {
      const __m128i e8 = h ? _mm256_extracti128_si256(exps, 1) : _mm256_castsi256_si128(exps);
      const __m128i s8 = h ? _mm256_extracti128_si256(s, 1) : _mm256_castsi256_si128(s);
      const __m256i e = _mm256_cvtepu8_epi16(e8), m = _mm256_cvtepu8_epi16(s8);
      const __m256i v = _mm256_or_si256(
          _mm256_or_si256(_mm256_slli_epi16(_mm256_and_si256(m, s80), 8), _mm256_slli_epi16(e, 7)),
          _mm256_and_si256(m, m7f));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i + 16 * h), v);
    }
  }
  exp4_combine_scalar(sm + i, nib + i / 2, base, n - i, out + i);
}

void stream_copy_avx2(std::byte* dst, const std::byte* src, size_t bytes) {
  const size_t head = std::min(bytes, size_t(-reinterpret_cast<uintptr_t>(dst) & 63));
  std::memcpy(dst, src, head);
  size_t i = head;
  for (; i + 64 <= bytes; i += 64) {
    const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i));
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i + 32));
    _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + i), a);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + i + 32), b);
  }
  std::memcpy(dst + i, src + i, bytes - i);
}

}  // namespace k3::io::codec::detail
