// Per-ISA bodies of the KDA step (raw pointers: ISA translation units must not instantiate inline
// code shared with baseline ones). All bodies produce identical bits.
#pragma once
#include <cstddef>

namespace k3::kernels::detail {

// Value channels j are independent in the step (column j of S, u_j and o_j see only alpha, k, q,
// beta and v_j), so the bodies run it strip by strip over at most this many columns, with the
// strip's u / v - u / o on the stack: any head dim, no allocation, and each S[i][j], u_j, o_j sees
// the same operations in the same i order as in one pass over all columns.
inline constexpr size_t kKdaStrip = 256;

void kda_step_scalar(float* S, const float* alpha, const float* k, const float* v, float beta, const float* q,
                     float* o, size_t D);
void kda_step_avx2(float* S, const float* alpha, const float* k, const float* v, float beta, const float* q,
                   float* o, size_t D);
void kda_step_avx512(float* S, const float* alpha, const float* k, const float* v, float beta, const float* q,
                     float* o, size_t D);

}  // namespace k3::kernels::detail
