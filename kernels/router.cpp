#include "kernels/router.hpp"

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include <cmath>
#include <limits>
#include <vector>

namespace k3::kernels {

namespace {

inline double widen(float v) {
  return static_cast<double>(v);
}
inline double widen(uint16_t v) {
  return static_cast<double>(bf16_to_f32(v));
}

// Logits of experts [e0, e1): one sequential f64 accumulator per expert (NOT the 16-lane tree).
// Four experts run interleaved only so their independent chains overlap in the pipeline.
template <class T>
void score_experts(const T* w, size_t hidden, const float* x, size_t e0, size_t e1, float* s) {
  size_t e = e0;
  for (; e + 4 <= e1; e += 4) {
    const T* r0 = w + e * hidden;
    const T* r1 = r0 + hidden;
    const T* r2 = r1 + hidden;
    const T* r3 = r2 + hidden;
    double a0 = 0.0, a1 = 0.0, a2 = 0.0, a3 = 0.0;
    for (size_t i = 0; i < hidden; ++i) {
      const double xi = static_cast<double>(x[i]);
      a0 += widen(r0[i]) * xi;
      a1 += widen(r1[i]) * xi;
      a2 += widen(r2[i]) * xi;
      a3 += widen(r3[i]) * xi;
    }
    s[e] = static_cast<float>(a0);
    s[e + 1] = static_cast<float>(a1);
    s[e + 2] = static_cast<float>(a2);
    s[e + 3] = static_cast<float>(a3);
  }
  for (; e < e1; ++e) {
    const T* r = w + e * hidden;
    double a = 0.0;
    for (size_t i = 0; i < hidden; ++i) a += widen(r[i]) * static_cast<double>(x[i]);
    s[e] = static_cast<float>(a);
  }
  for (e = e0; e < e1; ++e) s[e] = 1.0f / (1.0f + ::expf(-s[e]));
}

template <class T>
void score_all(const T* w, size_t n_experts, size_t hidden, const float* x, float* s) {
  if (n_experts <= 64) {
    score_experts(w, hidden, x, 0, n_experts, s);
    return;
  }
  tbb::parallel_for(tbb::blocked_range<size_t>(0, n_experts, 16), [&](const tbb::blocked_range<size_t>& r) {
    score_experts(w, hidden, x, r.begin(), r.end(), s);
  });
}

}  // namespace

void route(const DenseMatrix& gate, std::span<const float> x, std::span<const float> bias,
           const RouterParams& p, std::span<float> scores, std::span<int32_t> idx, std::span<float> weight) {
  size_t n = 0;
  std::visit(
      [&](const auto& g) {
        n = g.rows;
        score_all(g.data.data(), g.rows, g.cols, x.data(), scores.data());
      },
      gate);

  // The bias steers SELECTION only; the weights are the unbiased sigmoids. A chosen expert's
  // biased score becomes -inf, so no later pass (strict >, from -inf) can pick it again.
  std::vector<float> c(n);
  for (size_t e = 0; e < n; ++e) c[e] = scores[e] + (bias.empty() ? 0.0f : bias[e]);
  for (size_t j = 0; j < p.top_k; ++j) {
    float best = -std::numeric_limits<float>::infinity();
    size_t pick = n;
    for (size_t e = 0; e < n; ++e) {
      if (c[e] > best) {
        best = c[e];
        pick = e;
      }
    }
    if (pick == n) {  // everything NaN or -inf
      idx[j] = 0;
      weight[j] = 0.0f;
      continue;
    }
    idx[j] = static_cast<int32_t>(pick);
    weight[j] = scores[pick];
    c[pick] = -std::numeric_limits<float>::infinity();
  }
  if (p.renormalize && p.top_k > 1) {
    double sum = 0.0;
    for (size_t j = 0; j < p.top_k; ++j) sum += static_cast<double>(weight[j]);
    const float inv = static_cast<float>(1.0 / (sum + 1e-20));
    for (size_t j = 0; j < p.top_k; ++j) weight[j] = weight[j] * inv;
  }
  for (size_t j = 0; j < p.top_k; ++j) weight[j] = weight[j] * p.routed_scale;
}

}  // namespace k3::kernels
