// Per-ISA row bodies of the matmuls (docs/model.md §5.3 dense, §5.4 MXFP4). Raw pointers only: the ISA
// translation units must not instantiate inline code shared with baseline ones (the linker may keep
// any one copy). Every body writes identical bits.
//
// A body computes `rows` consecutive rows starting at the given weight pointer(s) for `tokens`
// inputs: x is [tokens][cols] already widened to f64 (exact), and row r of token t goes to
// y[t * y_stride + r].
#pragma once
#include <cstddef>
#include <cstdint>

namespace k3::kernels {
struct Exp3Block;
}

namespace k3::kernels::detail {

using F32Rows = void (*)(const float* w, size_t rows, size_t cols, const double* x, size_t tokens, float* y,
                         size_t y_stride);
using Bf16Rows = void (*)(const uint16_t* w, size_t rows, size_t cols, const double* x, size_t tokens,
                          float* y, size_t y_stride);
// packed rows are (cols + 1) / 2 bytes, scale rows (cols + 31) / 32 bytes.
using Mxfp4Rows = void (*)(const uint8_t* packed, const uint8_t* scales, size_t rows, size_t cols,
                           const double* x, size_t tokens, float* y, size_t y_stride);

struct MatmulBodies {
  F32Rows f32;
  Bf16Rows bf16;
  Mxfp4Rows mxfp4;
  // Optional (nullptr: none), for tokens > 1: a bf16 body reading x widened in the AVX-512 bodies'
  // P/Q lane order -- each full block of 16 columns stored as x0-3, x8-11, x4-7, x12-15, the columns
  // past the last full block as they are (kernels/matmul.cpp, widen_pq). Same bits as `bf16`.
  Bf16Rows bf16_pq = nullptr;
};

MatmulBodies matmul_bodies_scalar();
MatmulBodies matmul_bodies_avx2();
MatmulBodies matmul_bodies_avx512();

// The fused exp3 body (matmul_exp3_avx512.cpp, AVX-512BW + VBMI + VBMI2): `rows` rows of `cols` values,
// the first at value `first` of the exp3 array whose blocks [blocks, blocks + n_blocks) cover them,
// straight from the stored bytes. false: a block's codes are malformed (its escapes run past its
// list; nothing was read out of bounds) -- y may hold partial results, the caller decodes instead.
using Exp3Rows = bool (*)(const Exp3Block* blocks, size_t n_blocks, uint64_t first, size_t rows, size_t cols,
                          const double* x, size_t tokens, float* y, size_t y_stride);
Exp3Rows matmul_exp3_avx512();

}  // namespace k3::kernels::detail
