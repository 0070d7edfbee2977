// Internal: the per-block encoders and decoders behind codec.cpp's stream container.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/weights.hpp"

namespace k3::io::codec::detail {

// A malformed block: what is wrong and the byte offset inside the block's stored bytes.
struct BlockFault {
  std::string what;
  size_t offset = 0;
};

// exp4 block: base u8, 0 u8, n_esc u16, sm[n], nib[(n+1)/2], esc_pos u16[n_esc], esc_exp u8[n_esc].
void exp4_encode_block(const uint16_t* v, size_t n, std::vector<std::byte>& out);
// Decodes n values from the block's `size` stored bytes; throws BlockFault.
void exp4_decode_block(const std::byte* blk, size_t size, size_t n, uint16_t* out);

// exp3 block: base u8, 0 u8, n_esc u16, sm[n], codes[exp3_code_bytes(n)], esc_exp u8[n_esc]. The codes
// are bit planes per group of 64 values: u64 words plane0, plane1, plane2 (bit j of plane k = bit k
// of value j's code); a last group's unused bits are 0. Code 7 = escape (exponent in esc_exp, in
// value order), codes 0..6 = base + code.
constexpr size_t kExp3Group = 64;
constexpr size_t kExp3GroupBytes = 24;
size_t exp3_code_bytes(size_t n);
void exp3_encode_block(const uint16_t* v, size_t n, std::vector<std::byte>& out);
void exp3_decode_block(const std::byte* blk, size_t size, size_t n, uint16_t* out);
// The block's parts (sm, planes, esc, base, n_esc) into v, its header validated as
// exp3_decode_block does (not the codes themselves); false when malformed.
bool exp3_view_block(const std::byte* blk, size_t size, size_t n, kernels::Exp3Block& v);

// huff block: n_sym-1 u8, 0 u8, 0 u16, bits_bytes u32, (sym u8, len u8)[n_sym], sm[n], bits.
void huff_encode_block(const uint16_t* v, size_t n, std::vector<std::byte>& out);
void huff_decode_block(const std::byte* blk, size_t size, size_t n, uint16_t* out);

// out[i] = bf16 from sign+mantissa byte sm[i] and exponent base + nibble i of nib (low nibble first).
void exp4_combine_scalar(const uint8_t* sm, const uint8_t* nib, uint8_t base, size_t n, uint16_t* out);
void exp4_combine_avx2(const uint8_t* sm, const uint8_t* nib, uint8_t base, size_t n, uint16_t* out);
void exp4_combine_avx512(const uint8_t* sm, const uint8_t* nib, uint8_t base, size_t n, uint16_t* out);

// out[i] = bf16 from sm[i] and exponent uint8(base + code i) (code 7 gives base + 7, which the
// decoder then patches from the escape list).
void exp3_combine_scalar(const uint8_t* sm, const uint8_t* codes, uint8_t base, size_t n, uint16_t* out);
void exp3_combine_avx2(const uint8_t* sm, const uint8_t* codes, uint8_t base, size_t n, uint16_t* out);
void exp3_combine_avx512(const uint8_t* sm, const uint8_t* codes, uint8_t base, size_t n, uint16_t* out);

inline uint16_t bf16_join(uint8_t sm, uint8_t exp) {
  return static_cast<uint16_t>((uint16_t(sm & 0x80) << 8) | (uint16_t(exp) << 7) | (sm & 0x7F));
}
inline uint8_t bf16_exp(uint16_t v) {
  return static_cast<uint8_t>(v >> 7);
}
inline uint8_t bf16_sm(uint16_t v) {
  return static_cast<uint8_t>(((v >> 8) & 0x80) | (v & 0x7F));
}

}  // namespace k3::io::codec::detail
