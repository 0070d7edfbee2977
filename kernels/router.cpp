#include "kernels/router.hpp"

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "kernels/dispatch.hpp"
#include "kernels/router_bodies.hpp"

namespace k3::kernels {

namespace {

inline double widen(float v) {
  return static_cast<double>(v);
}
inline double widen(uint16_t v) {
  return static_cast<double>(bf16_to_f32(v));
}

// Scalar body. Logits of experts [e0, e1): one sequential f64 accumulator per expert (NOT the
// 16-lane tree). Eight experts run interleaved only so that their independent add chains overlap in the
// pipeline; each chain still sees its own products in index order.
constexpr size_t kChains = 8;

template <class T>
void score_experts(const T* w, size_t hidden, const float* x, size_t e0, size_t e1, float* logit) {
  size_t e = e0;
  for (; e + kChains <= e1; e += kChains) {
    const T* rows = w + e * hidden;
    double a[kChains] = {};
    for (size_t i = 0; i < hidden; ++i) {
      const double xi = static_cast<double>(x[i]);
#pragma GCC unroll 8
      for (size_t c = 0; c < kChains; ++c) a[c] += widen(rows[c * hidden + i]) * xi;
    }
    for (size_t c = 0; c < kChains; ++c) logit[e + c] = static_cast<float>(a[c]);
  }
  for (; e < e1; ++e) {
    const T* r = w + e * hidden;
    double a = 0.0;
    for (size_t i = 0; i < hidden; ++i) a += widen(r[i]) * static_cast<double>(x[i]);
    logit[e] = static_cast<float>(a);
  }
}

void logits_f32(const float* w, size_t n, size_t hidden, const float* x, const double* xw, float* s) {
  if (active_isa() == Isa::scalar) {
    count_body_run(Kernel::router, Isa::scalar);
    score_experts(w, hidden, x, 0, n, s);
  } else {
    count_body_run(Kernel::router, Isa::avx2);
    detail::router_logits_f32_avx2(w, n, hidden, xw, s);  // serves AVX-512 machines too
  }
}

void logits_bf16(const uint16_t* w, size_t n, size_t hidden, const float* x, const double* xw, float* s) {
  if (active_isa() == Isa::scalar) {
    count_body_run(Kernel::router, Isa::scalar);
    score_experts(w, hidden, x, 0, n, s);
  } else {
    count_body_run(Kernel::router, Isa::avx2);
    detail::router_logits_bf16_avx2(w, n, hidden, xw, s);
  }
}

// Experts are independent: above 64 of them they are scored in parallel, never changing a bit.
template <class T>
void score_all(const T* w, size_t n_experts, size_t hidden, const float* x, float* s) {
  std::vector<double> xw(x, x + hidden);
  auto run = [&](size_t e0, size_t e1) {
    if constexpr (std::is_same_v<T, float>) {
      logits_f32(w + e0 * hidden, e1 - e0, hidden, x, xw.data(), s + e0);
    } else {
      logits_bf16(w + e0 * hidden, e1 - e0, hidden, x, xw.data(), s + e0);
    }
    for (size_t e = e0; e < e1; ++e) s[e] = 1.0f / (1.0f + ::expf(-s[e]));
  };
  if (n_experts <= 64) {
    run(0, n_experts);
    return;
  }
  tbb::parallel_for(tbb::blocked_range<size_t>(0, n_experts, 32),
                    [&](const tbb::blocked_range<size_t>& r) { run(r.begin(), r.end()); });
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
