// Causal depthwise ShortConv + SiLU (docs/model.md §3.5 step 2, §5.2), one time step for all channels.
#pragma once
#include <cstddef>
#include <span>

namespace k3::kernels {

// x: [channels] raw input at t; w: [channels][K] (tap K-1 multiplies x); hist: [channels][K-1]
// raw past inputs, oldest first, updated in place (shifted, x appended); y: [channels].
void shortconv_step(std::span<const float> x, std::span<const float> w, size_t K, std::span<float> hist,
                    std::span<float> y);

}  // namespace k3::kernels
