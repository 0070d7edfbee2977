// Attention-residual aggregation over block snapshots (docs/model.md §3.4, §5.2).
#pragma once
#include <span>

namespace k3::kernels {

// fold_i = norm_i * proj_i
void attnres_fold(std::span<const float> norm_w, std::span<const float> proj_w, std::span<float> fold);

// sources[s] are hidden-wide vectors, oldest block first, running prefix last. scores needs
// sources.size() floats of scratch. out may not alias a source.
void attnres(std::span<const std::span<const float>> sources, std::span<const float> fold, float eps,
             std::span<float> scores, std::span<float> out);

}  // namespace k3::kernels
