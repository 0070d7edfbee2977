// What each of N ranks holds under the built split (docs/distributed.md §2, §3): expert e of every
// MoE layer on rank e mod N, the head and the trunk on every rank. From the shard headers alone, so
// `k3flow plan --ranks N` sizes the 1.56 TB model from its sparse replica.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "io/config.hpp"
#include "io/safetensors.hpp"

namespace k3::pipeline::ranks {

struct RankShare {
  int rank = 0;
  int experts_per_layer = 0;  // of each MoE layer's n_experts
  uint64_t expert_bytes = 0;  // the read buffers of its routed experts, every bound MoE layer
};

struct RankSplit {
  int ranks = 1, bound_layers = 0, moe_layers = 0;
  uint64_t head_bytes = 0, trunk_bytes = 0;  // replicated on every rank
  uint64_t all_expert_bytes = 0;
  uint64_t gather_bytes = 0;  // one MoE layer's expert slots for one position: top_k x latent x 4
  std::vector<RankShare> per_rank;
};

// n_layers <= 0: every layer. Throws io::Error naming a tensor the shards do not hold.
RankSplit split_ranks(const io::ShardSet&, const io::ModelConfig&, int ranks, int n_layers = 0);
std::string format_split(const RankSplit&, const io::ModelConfig&);

}  // namespace k3::pipeline::ranks
