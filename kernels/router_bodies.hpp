// Per-ISA bodies of the router logits (raw pointers only; see matmul_bodies.hpp). Each writes, for
// experts [0, n) of the rows at w and inputs t = 0..tokens-1 (x is [tokens][hidden], widened to f64),
// logit[t * logit_stride + e] = rd32(sequential f64 sum over i of w[e][i] * x[t][i]): one accumulator
// per (expert, input), never a tree. SIMD bodies put experts, not i, across the lanes, and read and
// transpose each block of the gate once for up to eight inputs.
#pragma once
#include <cstddef>
#include <cstdint>

namespace k3::kernels::detail {

void router_logits_f32_avx2(const float* w, size_t n, size_t hidden, const double* x, size_t tokens,
                            float* logit, size_t logit_stride);
void router_logits_bf16_avx2(const uint16_t* w, size_t n, size_t hidden, const double* x, size_t tokens,
                             float* logit, size_t logit_stride);
void router_logits_f32_avx512(const float* w, size_t n, size_t hidden, const double* x, size_t tokens,
                              float* logit, size_t logit_stride);
void router_logits_bf16_avx512(const uint16_t* w, size_t n, size_t hidden, const double* x, size_t tokens,
                               float* logit, size_t logit_stride);

}  // namespace k3::kernels::detail
