// Exact widening of stored weights to f32 (docs/model.md §2.1: "widen BF16/F16/F32 exactly"; U8 widens
// to its integer value). Every BF16 and F16 value, including ±0, ±inf, NaN payloads and F16
// subnormals, is representable in f32, so these are bit-exact maps with no rounding.
#pragma once
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <stdexcept>

#include "io/safetensors.hpp"

namespace k3::io {

inline float bf16_to_f32(uint16_t b) {
  return std::bit_cast<float>(uint32_t{b} << 16);
}

inline float f16_to_f32(uint16_t h) {
  const uint32_t sign = uint32_t{h & 0x8000u} << 16;
  const uint32_t exp = (h >> 10) & 0x1F;
  uint32_t mant = h & 0x3FF;
  if (exp == 0x1F) return std::bit_cast<float>(sign | 0x7F800000u | (mant << 13));  // inf / NaN
  if (exp != 0) return std::bit_cast<float>(sign | ((exp + 112) << 23) | (mant << 13));
  if (mant == 0) return std::bit_cast<float>(sign);  // ±0
  // Subnormal m * 2^-24: normalise the mantissa into an f32 normal.
  int e = 113;  // biased f32 exponent of 2^-14
  while ((mant & 0x400) == 0) {
    mant <<= 1;
    --e;
  }
  return std::bit_cast<float>(sign | (uint32_t(e) << 23) | ((mant & 0x3FF) << 13));
}

// Widens `src` (little-endian values of `dtype`) into `dst`; dst.size() * dtype_size == src.size().
inline void widen_to_f32(DType dtype, std::span<const std::byte> src, std::span<float> dst) {
  if (src.size() != dst.size() * dtype_size(dtype))
    throw std::invalid_argument("widen_to_f32: size mismatch");
  const auto* s = reinterpret_cast<const unsigned char*>(src.data());
  for (size_t i = 0; i < dst.size(); ++i) {
    switch (dtype) {
      case DType::U8:
        dst[i] = static_cast<float>(s[i]);
        break;
      case DType::BF16:
        dst[i] = bf16_to_f32(static_cast<uint16_t>(s[2 * i] | s[2 * i + 1] << 8));
        break;
      case DType::F16:
        dst[i] = f16_to_f32(static_cast<uint16_t>(s[2 * i] | s[2 * i + 1] << 8));
        break;
      case DType::F32:
        std::memcpy(&dst[i], s + 4 * i, 4);
        break;
    }
  }
}

}  // namespace k3::io
