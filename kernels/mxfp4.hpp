// OCP MXFP4 element and scale encodings (docs/model.md §4). Data only: the matmul reads packed nibbles
// directly and never builds a dequantised copy.
#pragma once
#include <cstddef>
#include <cstdint>

namespace k3::kernels {

inline constexpr size_t kMxfp4Group = 32;

// E2M1 nibble -> value; bit 3 is the sign (nibble 8 is -0).
inline constexpr float kE2m1[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                    -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

// Byte 255 (NaN by the spec) marks a group the matmul skips entirely.
inline constexpr uint8_t kE8m0Skip = 255;

// Bytes per packed row / scale row of a matrix with `cols` logical elements per row.
inline constexpr size_t mxfp4_packed_cols(size_t cols) {
  return (cols + 1) / 2;
}
inline constexpr size_t mxfp4_scale_cols(size_t cols) {
  return (cols + kMxfp4Group - 1) / kMxfp4Group;
}

// 2^(b - 127) as f32 for b <= 254 (b = 0 is the subnormal 2^-127).
float e8m0_to_f32(uint8_t b);

}  // namespace k3::kernels
