#include "kernels/attnres.hpp"

#include <cstddef>

#include "kernels/activations.hpp"
#include "kernels/attention.hpp"
#include "kernels/norms.hpp"

namespace k3::kernels {

void attnres_fold(std::span<const float> norm_w, std::span<const float> proj_w, std::span<float> fold) {
  for (size_t i = 0; i < fold.size(); ++i) fold[i] = norm_w[i] * proj_w[i];
}

void attnres(std::span<const std::span<const float>> sources, std::span<const float> fold, float eps,
             std::span<float> scores, std::span<float> out) {
  const size_t n = sources.size();
  for (size_t s = 0; s < n; ++s) {
    const std::span<const float> v = sources[s];
    // Keys are RMS-normalised without gain (the gain lives in fold); each v_i * inv is rounded to
    // f32 before it is widened into the sequential f64 dot.
    const float inv = rms_inverse(v, eps);
    double acc = 0.0;
    for (size_t i = 0; i < v.size(); ++i) {
      acc += static_cast<double>(v[i] * inv) * static_cast<double>(fold[i]);
    }
    scores[s] = static_cast<float>(acc);
  }
  softmax(scores.first(n), scores.first(n), SoftmaxSeed::first);
  // Values are the RAW sources.
  weighted_sum(scores.first(n), sources, out);
}

}  // namespace k3::kernels
