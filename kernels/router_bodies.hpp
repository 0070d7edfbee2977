// Per-ISA bodies of the router logits (raw pointers only; see matmul_bodies.hpp). Each writes, for
// experts [0, n) of the rows at w, logit[e] = rd32(sequential f64 sum over i of w[e][i] * x[i]):
// one accumulator per expert, never a tree. SIMD bodies put experts, not i, across the lanes.
#pragma once
#include <cstddef>
#include <cstdint>

namespace k3::kernels::detail {

void router_logits_f32_avx2(const float* w, size_t n, size_t hidden, const double* x, float* logit);
void router_logits_bf16_avx2(const uint16_t* w, size_t n, size_t hidden, const double* x, float* logit);

}  // namespace k3::kernels::detail
