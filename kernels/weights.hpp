// Weight views: the tag and the pointer cannot disagree. Row-major [rows][cols] (PyTorch Linear:
// y = W x, y[o] = sum_i W[o][i] x[i]). Views never own memory.
#pragma once
#include <bit>
#include <cstddef>
#include <cstdint>
#include <span>
#include <variant>
#include <vector>

namespace k3::kernels {

struct F32Matrix {
  std::span<const float> data;  // rows * cols
  size_t rows = 0, cols = 0;
};

struct Bf16Matrix {
  std::span<const uint16_t> data;  // rows * cols raw bf16 bits; widened exactly (bits << 16)
  size_t rows = 0, cols = 0;
};

// OCP MXFP4 (docs/model.md §4): element i of a row is the LOW nibble of byte i/2 when i is even, the high
// nibble when odd; one E8M0 scale byte per 32 consecutive elements. `cols` is the logical width.
struct Mxfp4Matrix {
  std::span<const uint8_t> packed;  // rows * ceil(cols/2) (real widths are even: rows * cols/2)
  std::span<const uint8_t> scales;  // rows * ceil(cols/32)
  size_t rows = 0, cols = 0;
};

// One block of an exp3-coded bf16 array (docs/codec.md, "exp3"), as the fused exp3 body reads it:
// values [first, first + n) of the array. A coded block: the n sign+mantissa bytes `sm`, the code
// planes (three little-endian u64 words per 64 values: word k holds bit k of each value's code,
// value j of the group in bit j; code 7 = escape, 0..6 = base + code) and the n_esc escape exponents
// `esc`, in value order. A block stored raw: `raw` holds its n values (2n bytes, little-endian, any
// alignment) and sm / planes / esc are null. first is a multiple of 64 (blocks hold 64k values).
struct Exp3Block {
  uint64_t first = 0;
  uint32_t n = 0, n_esc = 0;
  const uint8_t* sm = nullptr;
  const uint8_t* planes = nullptr;
  const uint8_t* esc = nullptr;
  const uint8_t* raw = nullptr;
  uint8_t base = 0;
};

// Decodes values of a coded bf16 array (a compressed trunk layer: io::codec::Stream) on demand.
// Must be thread-safe: the matmuls decode disjoint row ranges on several threads at once.
class Bf16Source {
 public:
  virtual void decode_values(uint64_t first, uint64_t count, uint16_t* out) const = 0;
  // An exp3 array: the blocks holding values [first, first + count), in order, into `out` (its
  // contents replaced), each block's header checked (base, reserved byte, escape count, size); the
  // fused exp3 body then reads the stored bytes directly. false: not an exp3 array, or a header is
  // malformed (the caller decodes with decode_values, which reports the fault).
  virtual bool exp3_blocks(uint64_t /*first*/, uint64_t /*count*/, std::vector<Exp3Block>& /*out*/) const {
    return false;
  }

 protected:
  ~Bf16Source() = default;
};

// A bf16 matrix held coded (docs/codec.md, "Fused decode"): values [first, first + rows * cols) of
// `src`. The matmuls decode each task's rows into a cache-resident tile right before the bf16 body
// reads them, so the results are Bf16Matrix's bits and the decoded matrix is never written out; an
// exp3 source on AVX-512 with VBMI2 is multiplied straight from its blocks instead (exp3_blocks,
// docs/codec.md "Fused exp3 body"), with the same bits.
struct CodedBf16Matrix {
  const Bf16Source* src = nullptr;
  uint64_t first = 0;
  size_t rows = 0, cols = 0;
};

using DenseMatrix = std::variant<F32Matrix, Bf16Matrix>;
using Matrix = std::variant<F32Matrix, Bf16Matrix, Mxfp4Matrix, CodedBf16Matrix>;

inline size_t rows_of(const Matrix& m) {
  return std::visit([](const auto& w) { return w.rows; }, m);
}
inline size_t cols_of(const Matrix& m) {
  return std::visit([](const auto& w) { return w.cols; }, m);
}

// bf16 -> f32 is exact: the bits move to the top half.
inline float bf16_to_f32(uint16_t bits) {
  return std::bit_cast<float>(static_cast<uint32_t>(bits) << 16);
}

}  // namespace k3::kernels
