// exp3 combine, AVX-512BW(+VL): a group of 64 values a step, 32 at a time; the group's three code
// planes are the byte lanes' masks. Bit-identical to exp3_combine_scalar.
#include <immintrin.h>

#include <cstring>

#include "io/codec/blocks.hpp"

namespace k3::io::codec::detail {

namespace {
// Prefetch distance in values, as exp4's bodies: 8 KiB of sign+mantissa bytes and their 3 KiB of
// codes, over a 4096-value block ahead (the coded bytes stream from DRAM in a fused matvec).
constexpr size_t kAhead = 8192;
}  // namespace

void exp3_combine_avx512(const uint8_t* sm, const uint8_t* codes, uint8_t base, size_t n, uint16_t* out) {
  const __m256i vbase = _mm256_set1_epi8(static_cast<char>(base));
  const __m256i one = _mm256_set1_epi8(1), two = _mm256_set1_epi8(2), four = _mm256_set1_epi8(4);
  const __m512i s80 = _mm512_set1_epi16(0x0080), m7f = _mm512_set1_epi16(0x007F);
  size_t i = 0;
  for (; i + kExp3Group <= n; i += kExp3Group) {
    const uint8_t* c = codes + i / kExp3Group * kExp3GroupBytes;
    _mm_prefetch(reinterpret_cast<const char*>(sm + i + kAhead), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(c + kAhead / kExp3Group * kExp3GroupBytes), _MM_HINT_T0);
    uint64_t p[3];
    std::memcpy(p, c, sizeof p);
    for (unsigned h = 0; h < 2; ++h) {  // 32 values: the planes' low, then high 32 bits as lane masks
      __m256i e = _mm256_mask_add_epi8(vbase, _cvtu32_mask32(uint32_t(p[0] >> (32 * h))), vbase, one);
      e = _mm256_mask_add_epi8(e, _cvtu32_mask32(uint32_t(p[1] >> (32 * h))), e, two);
      e = _mm256_mask_add_epi8(e, _cvtu32_mask32(uint32_t(p[2] >> (32 * h))), e, four);
      const __m512i eh = _mm512_cvtepu8_epi16(e);
      const __m512i m =
          _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(sm + i + 32 * h)));
      // (m & 0x80) << 8 | e << 7 | (m & 0x7F); e < 256
      const __m512i v = _mm512_ternarylogic_epi32(_mm512_slli_epi16(_mm512_and_si512(m, s80), 8),
                                                  _mm512_slli_epi16(eh, 7), _mm512_and_si512(m, m7f), 0xFE);
      _mm512_storeu_si512(out + i + 32 * h, v);
    }
  }
  exp3_combine_scalar(sm + i, codes + i / kExp3Group * kExp3GroupBytes, base, n - i, out + i);
}

}  // namespace k3::io::codec::detail
