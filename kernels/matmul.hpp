// Dense (f32 / bf16, docs/model.md §5.3: 16 f64 lanes, fixed reduction tree) and MXFP4 (§5.4: per-group
// 8-lane f64 partials, scale multiply, f64 accumulate) matrix-vector products. Output rows are
// computed in parallel on oneTBB when rows > 64; the per-row arithmetic never depends on it.
#pragma once
#include <span>

#include "kernels/weights.hpp"

namespace k3::kernels {

// y[rows] = W x[cols].
void matvec(const Matrix& w, std::span<const float> x, std::span<float> y);

// Several tokens per pass over the weights (prefill): x is [tokens][cols], y is [tokens][rows].
// Bit-identical to calling matvec per token.
void matmul(const Matrix& w, std::span<const float> x, size_t tokens, std::span<float> y);

// Several matrices of the same width over the same x (a layer's projections of its input): one
// widening of x and one parallel pass over all their rows, instead of a fork and join per matrix.
// y of each is [tokens][rows of its w]. Bit-identical to one matmul per matrix. Throws
// std::invalid_argument when the widths differ or an output is too small.
struct MatmulOut {
  const Matrix* w;
  std::span<float> y;
};
void matmul_many(std::span<const MatmulOut> outs, std::span<const float> x, size_t tokens);

// One output row, for tests and the router-free callers: exactly what matvec writes to y[row].
float dot_row(const Matrix& w, size_t row, std::span<const float> x);

// The fused exp3 body (docs/codec.md, "Fused exp3 body"): a CodedBf16Matrix over an exp3 source is
// computed straight from the stored blocks when the active ISA is avx512 and the CPU has VBMI and VBMI2
// (available), else by the tile path. set_exp3_direct(false) forces the tile path (tests and
// benchmarks); exp3_direct_runs counts the tasks the body computed since the process started,
// exp3_direct_refused those it gave back to the tile path (a malformed block's codes).
bool exp3_direct_available();
void set_exp3_direct(bool on);
uint64_t exp3_direct_runs();
uint64_t exp3_direct_refused();

}  // namespace k3::kernels
