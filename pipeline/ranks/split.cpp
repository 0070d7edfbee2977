#include "pipeline/ranks/split.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "pipeline/ranks/rank_experts.hpp"
#include "stages/tensors.hpp"

namespace k3::pipeline::ranks {

namespace {

std::string gb(double bytes) {
  return fmt::format("{:.2f} GB", bytes / 1e9);
}

}  // namespace

RankSplit split_ranks(const io::ShardSet& shards, const io::ModelConfig& c, int ranks, int n_layers) {
  RankSplit s;
  s.ranks = ranks;
  s.bound_layers = (n_layers <= 0 || n_layers >= c.n_layers) ? c.n_layers : n_layers;
  s.head_bytes = stages::locate(stages::model_tensors(c), shards, c).buffer_bytes;
  s.gather_bytes = uint64_t(c.top_k) * uint64_t(c.latent) * sizeof(float);
  for (int r = 0; r < ranks; ++r)
    s.per_rank.push_back(RankShare{.rank = r, .experts_per_layer = 0, .expert_bytes = 0});
  for (int e = 0; e < c.n_experts; ++e) ++s.per_rank[size_t(expert_owner(e, ranks))].experts_per_layer;
  for (int l = 0; l < s.bound_layers; ++l) {
    s.trunk_bytes += stages::locate(stages::layer_tensors(c, l).tensors, shards, c).buffer_bytes;
    if (c.is_dense(l)) continue;
    ++s.moe_layers;
    for (int e = 0; e < c.n_experts; ++e) {
      const uint64_t b = stages::locate_expert(shards, c, l, e).buffer_bytes;
      s.per_rank[size_t(expert_owner(e, ranks))].expert_bytes += b;
      s.all_expert_bytes += b;
    }
  }
  return s;
}

std::string format_split(const RankSplit& s, const io::ModelConfig& c) {
  const uint64_t replicated = s.head_bytes + s.trunk_bytes;
  std::string out = fmt::format(
      "split over {} ranks: routed experts placed (expert e on rank e mod {}), trunk and head on every rank "
      "(docs/distributed.md)\n"
      "  on every rank: head {}, trunk {} ({} layers)\n"
      "  {:>4}  {:>13}  {:>20}  {:>16}\n",
      s.ranks, s.ranks, gb(double(s.head_bytes)), gb(double(s.trunk_bytes)), s.bound_layers, "rank",
      "experts/layer", "routed-expert bytes", "total per rank");
  uint64_t largest = 0;
  for (const RankShare& r : s.per_rank) {
    largest = std::max(largest, replicated + r.expert_bytes);
    out += fmt::format("  {:>4}  {:>13}  {:>20}  {:>16}\n", r.rank, r.experts_per_layer,
                       gb(double(r.expert_bytes)), gb(double(replicated + r.expert_bytes)));
  }
  const double received =
      double(s.gather_bytes) * double(s.moe_layers) * double(s.ranks - 1) / double(s.ranks);
  out += fmt::format(
      "  per decoded token: {} allgathers (one per MoE layer) of {} B each (top-{} x latent {} x 4 B), every "
      "rank receiving ~{} of them ({:.2f} MB per token); prefill multiplies the bytes by the tokens, not the "
      "messages\n"
      "  largest rank {}; with the trunk row-parallel too (not built yet): {} per rank\n",
      s.moe_layers, s.gather_bytes, c.top_k, c.latent,
      s.ranks > 1 ? fmt::format("{}/{}", s.ranks - 1, s.ranks) : "0", received / 1e6, gb(double(largest)),
      gb(double(replicated + s.all_expert_bytes) / double(s.ranks)));
  return out;
}

}  // namespace k3::pipeline::ranks
