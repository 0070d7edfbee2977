// Expert parallel over a Comm (docs/distributed.md §2): rank r of N owns expert e of every MoE layer
// iff e mod N == r, computes it whole over the rows that chose it, and after the layer's own experts
// one allgatherv hands every rank the rows every other rank computed. No arithmetic crosses ranks:
// the combine sums the [T][top_k] slots in top-k order on every rank, so every rank holds the
// single process's hidden state after every layer.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "io/config.hpp"
#include "pipeline/ranks/comm.hpp"
#include "stages/moe.hpp"

namespace k3::pipeline::ranks {

inline int expert_owner(int expert, int ranks) {
  return expert % ranks;
}

class RankExperts final : public stages::ExpertExchange {
 public:
  explicit RankExperts(Comm& comm) : comm_(comm), rank_(comm.rank()), size_(comm.size()) {}

  bool owns(int expert) const override { return expert_owner(expert, size_) == rank_; }
  void exchange(const stages::ExpertGroups&, const io::ModelConfig&, std::span<float> eout) override;

  // What the exchanges cost so far on this rank (perf/dist_bench): seconds include waiting for the
  // slowest rank to reach the exchange (the routing skew), not only the transfer.
  struct Stats {
    uint64_t messages = 0, bytes_sent = 0, bytes_received = 0, rows_computed = 0;
    double seconds = 0;
  };
  const Stats& stats() const { return stats_; }

 private:
  Comm& comm_;
  int rank_, size_;
  std::vector<size_t> counts_;
  std::vector<float> mine_, all_;
  Stats stats_;
};

}  // namespace k3::pipeline::ranks
