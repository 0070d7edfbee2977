// Feed-forward stages (docs/model.md §3.7, §3.8). Stable LatentMoE is split into the nodes a flow
// graph schedules separately: route -> (latent down-projection, shared experts) -> one
// expert_compute per selected expert -> moe_combine. moe_forward chains them for resident weights.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "io/config.hpp"
#include "stages/bind.hpp"

namespace k3::stages {

// Router on the FULL-width post-normed input: idx/weight [T][top_k] in selection order (descending
// biased score, ties -> lower expert). The bias steers selection only; weights are the unbiased
// sigmoids, renormalised, times routed_scale. The rows are scored kRouteRows at a time, each gate
// row read once for all of them (kernels::route_rows); scratch: route_scratch floats.
inline constexpr size_t kRouteRows = 8;
void route(const MoeWeights&, const io::ModelConfig&, std::span<const float> x, size_t T,
           std::span<int32_t> idx, std::span<float> weight, std::span<float> scratch);
size_t route_scratch(const io::ModelConfig&);

// z = W_down x: [T][latent]. Routing uses x, never z.
void moe_latent(const MoeWeights&, std::span<const float> x, size_t T, std::span<float> z);

// One routed expert on n latent rows (the tokens that selected it): out = W2 SiTU(W1 z, W3 z),
// [n][latent]. Any number of rows per call gives the same bits per row.
void expert_compute(const ExpertWeights&, const io::ModelConfig&, std::span<const float> z, size_t n,
                    std::span<float> out, std::span<float> scratch);
size_t expert_scratch(const io::ModelConfig&, size_t n);

// Shared experts on the ORIGINAL full-width x, unweighted: [T][hidden].
void shared_experts(const MoeWeights&, const io::ModelConfig&, std::span<const float> x, size_t T,
                    std::span<float> out, std::span<float> scratch);
size_t shared_scratch(const io::ModelConfig&, size_t T);

// out[t] = W_up RMSNorm(sum_j w[t][j] e[t][j]) + shared[t]; the aggregate is accumulated strictly in
// top-k order j = 0..k-1 and normed ONCE (never per expert). expert_out: [T][top_k][latent].
void moe_combine(const MoeWeights&, const io::ModelConfig&, std::span<const float> weight,
                 std::span<const float> expert_out, std::span<const float> shared, size_t T,
                 std::span<float> out, std::span<float> scratch);
size_t combine_scratch(const io::ModelConfig&, size_t T);

// Expert-major grouping of a routing idx [T][top_k]: the distinct experts in ascending order and,
// for each, the rows r = t * top_k + j that chose it, ascending. Reuses the vectors' capacity.
struct ExpertGroups {
  std::vector<int32_t> experts;
  std::vector<uint32_t> begin;  // experts.size() + 1 offsets into rows
  std::vector<uint32_t> rows;
  std::span<const uint32_t> rows_of(size_t i) const {
    return std::span<const uint32_t>(rows).subspan(begin[i], begin[i + 1] - begin[i]);
  }
};
void group_by_expert(std::span<const int32_t> idx, ExpertGroups& out);

// One routed expert applied to the rows that chose it: gathers z[row / top_k] (z: [T][latent]),
// runs expert_compute once over all of them and scatters the results to eout[row]
// ([T * top_k][latent]). Experts write disjoint rows, so they may run in any order or concurrently.
void expert_apply(const ExpertWeights&, const io::ModelConfig&, std::span<const float> z,
                  std::span<const uint32_t> rows, std::span<float> eout, std::span<float> scratch);
size_t expert_apply_scratch(const io::ModelConfig&, size_t n);

using ExpertFn = std::function<const ExpertWeights&(int expert)>;

// Expert parallel (docs/distributed.md §2): this process computes only the routed experts it owns,
// each whole over every row that chose it; exchange() then fills every other expert's rows of
// eout ([T * top_k][latent]) with the bytes its owner computed. Every process derives the same
// groups from the same routing, so nothing but those bytes moves, and the combine that follows sums
// in top-k order as in one process: the same bits. Set in MoeWeights::exchange.
class ExpertExchange {
 public:
  virtual ~ExpertExchange() = default;
  virtual bool owns(int expert) const = 0;
  virtual void exchange(const ExpertGroups&, const io::ModelConfig&, std::span<float> eout) = 0;
};

// The whole MoE block over T tokens with experts fetched through `expert` (expert-major: each
// selected expert runs once over all the rows that chose it).
void moe_forward(const MoeWeights&, const ExpertFn& expert, const io::ModelConfig&, std::span<const float> x,
                 size_t T, std::span<float> out, std::span<float> scratch);
size_t moe_scratch(const io::ModelConfig&, size_t T);

// Layer-0 dense FFN: out = W_down SiTU(W_gate x, W_up x).
void dense_ffn(const DenseFfnWeights&, const io::ModelConfig&, std::span<const float> x, size_t T,
               std::span<float> out, std::span<float> scratch);
size_t dense_scratch(const io::ModelConfig&, size_t T);

}  // namespace k3::stages
