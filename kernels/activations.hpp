// Scalar activations of the contract: f32 expf / tanhf from the platform libm, never vectorised
// approximations (docs/model.md §5.1).
#pragma once
#include <span>

namespace k3::kernels {

float sigmoid(float x);  // 1 / (1 + expf(-x)), all f32
float silu(float x);     // x * sigmoid(x)

// SiTU-GLU: y = [(b1 * tanhf(g / b1)) * sigmoid(g)] * [b2 * tanhf(u / b2)], sigmoid of the RAW gate.
void situ_glu(std::span<const float> gate, std::span<const float> up, float beta1, float beta2,
              std::span<float> y);

// x_i <- x_i * sigmoid(g_i)  (output gates of KDA and MLA)
void sigmoid_gate_inplace(std::span<float> x, std::span<const float> g);

// out_i <- out_i + (p * v_i), f32 multiply rounded then f32 add (MLA value sum, AttnRes, MoE agg).
void axpy(float p, std::span<const float> v, std::span<float> out);

// out_i = sum_j (w_j * v_j,i) in j order from +0, each step an f32 multiply then an f32 add: the MoE
// aggregate over the routed experts (selection order), the MLA value sum and the AttnRes output.
void weighted_sum(std::span<const float> weights, std::span<const std::span<const float>> vectors,
                  std::span<float> out);

// a_i <- a_i + b_i
void add_inplace(std::span<float> a, std::span<const float> b);

}  // namespace k3::kernels
