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

double widen(float v) {
  return static_cast<double>(v);
}
double widen(uint16_t v) {
  return static_cast<double>(bf16_to_f32(v));
}

// Scalar body. Logits of experts [e0, e1) for one input: one sequential f64 accumulator per expert
// (NOT the 16-lane tree). Eight experts run interleaved only so that their independent add chains
// overlap in the pipeline; each chain still sees its own products in index order.
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

// Logits of the n experts at w for `tokens` inputs (x [tokens][hidden]; xw the same widened to
// f64); input t's go to s[t * stride ...].
template <class T>
void logits(const T* w, size_t n, size_t hidden, const float* x, const double* xw, size_t tokens, float* s,
            size_t stride) {
  const Isa isa = active_isa();
  count_body_run(Kernel::router, isa);
  switch (isa) {
    case Isa::avx512:
      if constexpr (std::is_same_v<T, float>) {
        detail::router_logits_f32_avx512(w, n, hidden, xw, tokens, s, stride);
      } else {
        detail::router_logits_bf16_avx512(w, n, hidden, xw, tokens, s, stride);
      }
      return;
    case Isa::avx2:
      if constexpr (std::is_same_v<T, float>) {
        detail::router_logits_f32_avx2(w, n, hidden, xw, tokens, s, stride);
      } else {
        detail::router_logits_bf16_avx2(w, n, hidden, xw, tokens, s, stride);
      }
      return;
    case Isa::scalar:
      break;
  }
  for (size_t t = 0; t < tokens; ++t) score_experts(w, hidden, x + t * hidden, 0, n, s + t * stride);
}

// Experts are independent: above 64 of them they are scored in parallel, never changing a bit. Each
// task reads its experts' gate rows once for every input.
template <class T>
void score_all(const T* w, size_t n_experts, size_t hidden, const float* x, size_t tokens, float* s) {
  std::vector<double> xw(x, x + tokens * hidden);
  auto run = [&](size_t e0, size_t e1) {
    logits(w + e0 * hidden, e1 - e0, hidden, x, xw.data(), tokens, s + e0, n_experts);
    for (size_t t = 0; t < tokens; ++t) {
      float* st = s + t * n_experts;
      for (size_t e = e0; e < e1; ++e) st[e] = 1.0f / (1.0f + ::expf(-st[e]));
    }
  };
  if (n_experts <= 64) {
    run(0, n_experts);
    return;
  }
  tbb::parallel_for(tbb::blocked_range<size_t>(0, n_experts, 32),
                    [&](const tbb::blocked_range<size_t>& r) { run(r.begin(), r.end()); });
}

// One input's top-k from its unbiased sigmoids. The bias steers SELECTION only; the weights are the
// unbiased sigmoids. A chosen expert's biased score becomes -inf, so no later pass (strict >, from
// -inf) can pick it again. c: n floats of scratch.
void select(std::span<const float> scores, std::span<const float> bias, const RouterParams& p,
            std::span<float> c, std::span<int32_t> idx, std::span<float> weight) {
  const size_t n = scores.size();
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

}  // namespace

void route_rows(const DenseMatrix& gate, std::span<const float> x, size_t T, std::span<const float> bias,
                const RouterParams& p, std::span<float> scores, std::span<int32_t> idx,
                std::span<float> weight) {
  size_t n = 0;
  std::visit(
      [&](const auto& g) {
        n = g.rows;
        score_all(g.data.data(), g.rows, g.cols, x.data(), T, scores.data());
      },
      gate);
  std::vector<float> c(n);
  for (size_t t = 0; t < T; ++t)
    select(scores.subspan(t * n, n), bias, p, c, idx.subspan(t * p.top_k, p.top_k),
           weight.subspan(t * p.top_k, p.top_k));
}

void route(const DenseMatrix& gate, std::span<const float> x, std::span<const float> bias,
           const RouterParams& p, std::span<float> scores, std::span<int32_t> idx, std::span<float> weight) {
  route_rows(gate, x, 1, bias, p, scores, idx, weight);
}

}  // namespace k3::kernels
