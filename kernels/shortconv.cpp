#include "kernels/shortconv.hpp"

#include "kernels/activations.hpp"

namespace k3::kernels {

void shortconv_step(std::span<const float> x, std::span<const float> w, size_t K, std::span<float> hist,
                    std::span<float> y) {
  const size_t H = K - 1;
  for (size_t c = 0; c < x.size(); ++c) {
    const float cur = x[c];
    const float* wc = w.data() + c * K;
    float* hc = hist.data() + c * H;
    // Tap K-1 multiplies the current input; history is added oldest first, f32 mul then f32 add.
    float acc = wc[K - 1] * cur;
    for (size_t j = 0; j < H; ++j) acc = acc + wc[j] * hc[j];
    // The history carries RAW inputs, not conv outputs.
    for (size_t j = 0; j + 1 < H; ++j) hc[j] = hc[j + 1];
    if (H > 0) hc[H - 1] = cur;
    y[c] = acc * sigmoid(acc);
  }
}

}  // namespace k3::kernels
