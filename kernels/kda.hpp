// Kimi Delta Attention pieces (docs/model.md §3.5, §5.2). The recurrence is the naive per-step form.
#pragma once
#include <cstddef>
#include <span>

namespace k3::kernels {

// For every head h and channel d (i = h*D + d): a = expf(A_log[h]); u = a*(z_i + dt_bias_i);
// g_i = lower_bound * sigmoid(u); alpha_i = expf(g_i). A_log is indexed BY HEAD (first H values).
// `g` may be empty when the caller only needs alpha.
void kda_decay(std::span<const float> z, std::span<const float> a_log, std::span<const float> dt_bias,
               size_t heads, size_t head_dim, float lower_bound, std::span<float> g, std::span<float> alpha);

// 1.0f / sqrtf((float)D)
float kda_q_scale(size_t head_dim);

// One step of one head. S is [D][D] (row = key channel i, column = value channel j), updated in
// place: decay rows by alpha_i, read u = S^T k, delta write S += k (beta (v - u)), then
// o = S^T q_scaled from the UPDATED state. Zero k_i / q_i rows are skipped (f32 == 0). Any head_dim,
// no allocation (value channels run in stack-sized strips, kda_bodies.hpp); o must not overlap the
// inputs.
void kda_step(std::span<float> S, std::span<const float> alpha, std::span<const float> k,
              std::span<const float> v, float beta, std::span<const float> q_scaled, std::span<float> o,
              size_t head_dim);

}  // namespace k3::kernels
