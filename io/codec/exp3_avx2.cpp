// exp3 combine, AVX2: 32 values (half a code group) a step; each plane's 32 bits are spread to
// byte lanes by a shuffle and a bit test. Bit-identical to exp3_combine_scalar.
#include <immintrin.h>

#include <cstring>

#include "io/codec/blocks.hpp"

namespace k3::io::codec::detail {

namespace {
// Prefetch distance in values, as exp4's bodies (see exp3_avx512.cpp).
constexpr size_t kAhead = 8192;

// 32 bits -> 32 byte lanes, 0xFF where the bit is set (lane j <- bit j).
inline __m256i spread_bits(uint32_t bits) {
  const __m256i pick = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,  //
                                        2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
  const __m256i bit = _mm256_set1_epi64x(static_cast<long long>(0x8040201008040201ull));
  const __m256i x = _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(bits)), pick);
  return _mm256_cmpeq_epi8(_mm256_and_si256(x, bit), bit);
}
}  // namespace

void exp3_combine_avx2(const uint8_t* sm, const uint8_t* codes, uint8_t base, size_t n, uint16_t* out) {
  const __m256i vbase = _mm256_set1_epi8(static_cast<char>(base));
  const __m256i one = _mm256_set1_epi8(1), two = _mm256_set1_epi8(2), four = _mm256_set1_epi8(4);
  const __m256i s80 = _mm256_set1_epi16(0x0080), m7f = _mm256_set1_epi16(0x007F);
  size_t i = 0;
  for (; i + kExp3Group <= n; i += kExp3Group) {
    const uint8_t* c = codes + i / kExp3Group * kExp3GroupBytes;
    _mm_prefetch(reinterpret_cast<const char*>(sm + i + kAhead), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(c + kAhead / kExp3Group * kExp3GroupBytes), _MM_HINT_T0);
    uint32_t p[6];  // plane k's low half is p[2k], its high half p[2k + 1]
    std::memcpy(p, c, sizeof p);
    for (size_t h = 0; h < 2; ++h) {
      const __m256i code = _mm256_or_si256(_mm256_or_si256(_mm256_and_si256(spread_bits(p[h]), one),
                                                           _mm256_and_si256(spread_bits(p[2 + h]), two)),
                                           _mm256_and_si256(spread_bits(p[4 + h]), four));
      const __m256i exps = _mm256_add_epi8(code, vbase);
      const __m256i s = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(sm + i + 32 * h));
      for (int q = 0; q < 2; ++q) {
        const __m128i e8 = q ? _mm256_extracti128_si256(exps, 1) : _mm256_castsi256_si128(exps);
        const __m128i s8 = q ? _mm256_extracti128_si256(s, 1) : _mm256_castsi256_si128(s);
        const __m256i e = _mm256_cvtepu8_epi16(e8), m = _mm256_cvtepu8_epi16(s8);
        const __m256i v = _mm256_or_si256(
            _mm256_or_si256(_mm256_slli_epi16(_mm256_and_si256(m, s80), 8), _mm256_slli_epi16(e, 7)),
            _mm256_and_si256(m, m7f));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i + 32 * h + 16 * size_t(q)), v);
      }
    }
  }
  exp3_combine_scalar(sm + i, codes + i / kExp3Group * kExp3GroupBytes, base, n - i, out + i);
}

}  // namespace k3::io::codec::detail
