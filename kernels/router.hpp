// MoE router (docs/model.md §3.7 step 1, §5.2): sequential single f64 accumulator per expert (NOT the
// 16-lane matmul), independent sigmoids, bias for selection only, k strict-greater passes.
#pragma once
#include <cstddef>
#include <cstdint>
#include <span>

#include "kernels/weights.hpp"

namespace k3::kernels {

struct RouterParams {
  size_t top_k = 0;
  bool renormalize = true;
  float routed_scale = 1.0f;
};

// gate: [n_experts][hidden] (f32 or bf16). bias may be empty. scores: n_experts scratch (on return
// holds the unbiased sigmoids). idx/weight: top_k each, in selection order (descending biased
// score, ties -> lower index). Experts are scored in parallel; results never depend on it.
void route(const DenseMatrix& gate, std::span<const float> x, std::span<const float> bias,
           const RouterParams& p, std::span<float> scores, std::span<int32_t> idx, std::span<float> weight);

// T inputs at once (x [T][hidden]): the gate is read once for all of them (a batched step's rows,
// a prompt's). scores: T * n_experts scratch (input t's sigmoids at [t * n_experts]); idx/weight:
// [T][top_k]. Bit-identical to T calls of route.
void route_rows(const DenseMatrix& gate, std::span<const float> x, size_t T, std::span<const float> bias,
                const RouterParams& p, std::span<float> scores, std::span<int32_t> idx,
                std::span<float> weight);

}  // namespace k3::kernels
