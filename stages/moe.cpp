#include "stages/moe.hpp"

#include <algorithm>
#include <vector>

#include "kernels/activations.hpp"
#include "kernels/matmul.hpp"
#include "kernels/norms.hpp"
#include "kernels/router.hpp"
#include "stages/scratch.hpp"

namespace k3::stages {

namespace {
size_t sz(int v) {
  return static_cast<size_t>(v);
}

// out = W_down SiTU(W_gate x, W_up x) over T rows; the GLU shared by experts and the dense FFN.
void glu_ffn(const Matrix& gate_w, const Matrix& up_w, const Matrix& down_w, const io::ModelConfig& c,
             std::span<const float> x, size_t T, size_t inter, std::span<float> out,
             std::span<float> scratch) {
  Carver cut(scratch);
  std::span<float> g = cut.take(T * inter), u = cut.take(T * inter), a = cut.take(T * inter);
  const kernels::MatmulOut of_x[] = {{&gate_w, g}, {&up_w, u}};  // one parallel pass over x
  kernels::matmul_many(of_x, x, T);
  // SiTU: the sigmoid takes the RAW gate; tanh caps beta1 (gate) and beta2 (up).
  kernels::situ_glu(g, u, c.situ_beta, c.situ_linear_beta, a);
  kernels::matmul(down_w, a, T, out.first(T * kernels::rows_of(down_w)));
}
}  // namespace

size_t route_scratch(const io::ModelConfig& c) {
  return kRouteRows * sz(c.n_experts);
}

void route(const MoeWeights& w, const io::ModelConfig& c, std::span<const float> x, size_t T,
           std::span<int32_t> idx, std::span<float> weight, std::span<float> scratch) {
  const size_t E = sz(c.hidden), k = sz(c.top_k), n = sz(c.n_experts);
  const kernels::RouterParams p{k, c.moe_renormalize, c.routed_scale};
  for (size_t t = 0; t < T; t += kRouteRows) {
    const size_t r = std::min(kRouteRows, T - t);
    kernels::route_rows(w.router, x.subspan(t * E, r * E), r, w.bias, p, scratch.first(r * n),
                        idx.subspan(t * k, r * k), weight.subspan(t * k, r * k));
  }
}

void moe_latent(const MoeWeights& w, std::span<const float> x, size_t T, std::span<float> z) {
  kernels::matmul(w.down, x, T, z.first(T * kernels::rows_of(w.down)));
}

size_t expert_scratch(const io::ModelConfig& c, size_t n) {
  return 3 * n * sz(c.moe_inter);
}

void expert_compute(const ExpertWeights& w, const io::ModelConfig& c, std::span<const float> z, size_t n,
                    std::span<float> out, std::span<float> scratch) {
  glu_ffn(w.w1, w.w3, w.w2, c, z, n, sz(c.moe_inter), out, scratch);
}

size_t shared_scratch(const io::ModelConfig& c, size_t T) {
  return 3 * T * sz(c.moe_inter * c.n_shared);
}

void shared_experts(const MoeWeights& w, const io::ModelConfig& c, std::span<const float> x, size_t T,
                    std::span<float> out, std::span<float> scratch) {
  glu_ffn(w.shared_gate, w.shared_up, w.shared_down, c, x, T, sz(c.moe_inter * c.n_shared), out, scratch);
}

size_t combine_scratch(const io::ModelConfig& c, size_t T) {
  return T * sz(c.latent);
}

void moe_combine(const MoeWeights& w, const io::ModelConfig& c, std::span<const float> weight,
                 std::span<const float> expert_out, std::span<const float> shared, size_t T,
                 std::span<float> out, std::span<float> scratch) {
  const size_t L = sz(c.latent), k = sz(c.top_k), E = sz(c.hidden);
  std::span<float> agg = Carver(scratch).take(T * L);
  std::fill(agg.begin(), agg.end(), 0.0f);
  for (size_t t = 0; t < T; ++t) {
    std::span<float> a = agg.subspan(t * L, L);
    for (size_t j = 0; j < k; ++j)  // strictly in top-k order
      kernels::axpy(weight[t * k + j], expert_out.subspan((t * k + j) * L, L), a);
    if (c.latent_norm) kernels::rmsnorm_inplace(a, w.norm, c.rms_eps);  // once, on the aggregate
  }
  kernels::matmul(w.up, agg, T, out.first(T * E));
  kernels::add_inplace(out.first(T * E), shared.first(T * E));  // r + s_out
}

size_t moe_scratch(const io::ModelConfig& c, size_t T) {
  const size_t L = sz(c.latent), k = sz(c.top_k), E = sz(c.hidden), rows = T * k;
  return route_scratch(c) + rows + T * L + rows * L + T * E + shared_scratch(c, T) +
         expert_apply_scratch(c, rows) + combine_scratch(c, T);
}

void group_by_expert(std::span<const int32_t> idx, ExpertGroups& g) {
  g.experts.assign(idx.begin(), idx.end());
  std::sort(g.experts.begin(), g.experts.end());
  g.experts.erase(std::unique(g.experts.begin(), g.experts.end()), g.experts.end());
  g.begin.clear();
  g.rows.clear();
  for (int32_t e : g.experts) {
    g.begin.push_back(static_cast<uint32_t>(g.rows.size()));
    for (size_t r = 0; r < idx.size(); ++r)
      if (idx[r] == e) g.rows.push_back(static_cast<uint32_t>(r));
  }
  g.begin.push_back(static_cast<uint32_t>(g.rows.size()));
}

size_t expert_apply_scratch(const io::ModelConfig& c, size_t n) {
  return 2 * n * sz(c.latent) + expert_scratch(c, n);
}

void expert_apply(const ExpertWeights& w, const io::ModelConfig& c, std::span<const float> z,
                  std::span<const uint32_t> rows, std::span<float> eout, std::span<float> scratch) {
  const size_t L = sz(c.latent), k = sz(c.top_k), n = rows.size();
  Carver cut(scratch);
  std::span<float> zin = cut.take(n * L), zout = cut.take(n * L), sc = cut.take(expert_scratch(c, n));
  for (size_t i = 0; i < n; ++i) std::copy_n(z.begin() + (rows[i] / k) * L, L, zin.begin() + i * L);
  expert_compute(w, c, zin, n, zout, sc);
  for (size_t i = 0; i < n; ++i) std::copy_n(zout.begin() + i * L, L, eout.begin() + rows[i] * L);
}

void moe_forward(const MoeWeights& w, const ExpertFn& expert, const io::ModelConfig& c,
                 std::span<const float> x, size_t T, std::span<float> out, std::span<float> scratch) {
  const size_t L = sz(c.latent), k = sz(c.top_k), E = sz(c.hidden), rows = T * k;
  Carver cut(scratch);
  std::span<float> route_sc = cut.take(route_scratch(c)), weight = cut.take(rows), z = cut.take(T * L);
  std::span<float> eout = cut.take(rows * L);
  std::span<float> shared = cut.take(T * E), shared_sc = cut.take(shared_scratch(c, T));
  std::span<float> apply_sc = cut.take(expert_apply_scratch(c, rows)),
                   combine_sc = cut.take(combine_scratch(c, T));

  std::vector<int32_t> idx(rows);
  route(w, c, x, T, idx, weight, route_sc);
  moe_latent(w, x, T, z);
  shared_experts(w, c, x, T, shared, shared_sc);

  // Expert-major: each distinct expert runs once over every (token, slot) that chose it; the
  // outputs land in their [t][j] slots, so the combine still sums in top-k order.
  ExpertGroups groups;
  group_by_expert(idx, groups);
  for (size_t i = 0; i < groups.experts.size(); ++i)
    if (!w.exchange || w.exchange->owns(groups.experts[i]))
      expert_apply(expert(groups.experts[i]), c, z, groups.rows_of(i), eout, apply_sc);
  if (w.exchange) w.exchange->exchange(groups, c, eout);  // the other processes' experts' rows
  moe_combine(w, c, weight, eout, shared, T, out, combine_sc);
}

size_t dense_scratch(const io::ModelConfig& c, size_t T) {
  return 3 * T * sz(c.dense_inter);
}

void dense_ffn(const DenseFfnWeights& w, const io::ModelConfig& c, std::span<const float> x, size_t T,
               std::span<float> out, std::span<float> scratch) {
  glu_ffn(w.gate, w.up, w.down, c, x, T, sz(c.dense_inter), out, scratch);
}

}  // namespace k3::stages
