// Per-ISA bodies of the KDA step (raw pointers: ISA translation units must not instantiate inline
// code shared with baseline ones). All bodies produce identical bits.
#pragma once
#include <cstddef>

namespace k3::kernels::detail {

inline constexpr size_t kMaxKdaHeadDim = 256;  // u/o scratch lives on the stack

void kda_step_scalar(float* S, const float* alpha, const float* k, const float* v, float beta, const float* q,
                     float* o, size_t D);
void kda_step_avx2(float* S, const float* alpha, const float* k, const float* v, float beta, const float* q,
                   float* o, size_t D);
void kda_step_avx512(float* S, const float* alpha, const float* k, const float* v, float beta, const float* q,
                     float* o, size_t D);

}  // namespace k3::kernels::detail
