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
// The one widening routine of the engine (stages/bind.cpp widens every non-matrix weight with it);
// tests/test_safetensors.cpp checks it on every F16 and BF16 bit pattern.
inline void widen_to_f32(DType dtype, std::span<const std::byte> src, std::span<float> dst) {
  if (src.size() != dst.size() * dtype_size(dtype))
    throw std::invalid_argument("widen_to_f32: size mismatch");
  const auto* s = reinterpret_cast<const unsigned char*>(src.data());
  auto half = [s](size_t i) { return static_cast<uint16_t>(s[2 * i] | s[2 * i + 1] << 8); };
  switch (dtype) {
    case DType::U8:
      for (size_t i = 0; i < dst.size(); ++i) dst[i] = static_cast<float>(s[i]);
      return;
    case DType::BF16:
      for (size_t i = 0; i < dst.size(); ++i) dst[i] = bf16_to_f32(half(i));
      return;
    case DType::F16:
      for (size_t i = 0; i < dst.size(); ++i) dst[i] = f16_to_f32(half(i));
      return;
    case DType::F32:
      if (!dst.empty()) std::memcpy(dst.data(), s, dst.size() * 4);
      return;
  }
}

}  // namespace k3::io
