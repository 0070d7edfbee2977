#include "stages/head.hpp"

#include <algorithm>

#include "kernels/argmax.hpp"
#include "kernels/matmul.hpp"
#include "kernels/norms.hpp"

namespace k3::stages {

void embed_tokens(const HeadWeights& w, const io::ModelConfig& c, std::span<const int32_t> ids,
                  std::span<float> out) {
  const size_t E = static_cast<size_t>(c.hidden);
  for (size_t t = 0; t < ids.size(); ++t) {
    const size_t row = static_cast<size_t>(ids[t]) * E;
    std::span<float> dst = out.subspan(t * E, E);
    if (const auto* f = std::get_if<kernels::F32Matrix>(&w.embed)) {
      std::copy_n(f->data.begin() + row, E, dst.begin());
    } else {
      const auto& b = std::get<kernels::Bf16Matrix>(w.embed);
      for (size_t i = 0; i < E; ++i) dst[i] = kernels::bf16_to_f32(b.data[row + i]);
    }
  }
}

void lm_head(const HeadWeights& w, const io::ModelConfig& c, std::span<const float> h, size_t n,
             std::span<float> logits, std::span<float> scratch) {
  const size_t E = static_cast<size_t>(c.hidden);
  std::span<float> x = scratch.first(n * E);
  for (size_t i = 0; i < n; ++i)
    kernels::rmsnorm(h.subspan(i * E, E), w.final_norm, c.rms_eps, x.subspan(i * E, E));
  kernels::matmul(w.lm_head, x, n, logits.first(n * static_cast<size_t>(c.vocab)));
}

int32_t greedy(std::span<const float> logits) {
  return static_cast<int32_t>(kernels::argmax(logits));
}

}  // namespace k3::stages
