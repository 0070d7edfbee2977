#include "pipeline/ranks/rank_experts.hpp"

#include <algorithm>
#include <chrono>

namespace k3::pipeline::ranks {

void RankExperts::exchange(const stages::ExpertGroups& g, const io::ModelConfig& c, std::span<float> eout) {
  const size_t L = size_t(c.latent);
  counts_.assign(size_t(size_), 0);
  for (size_t i = 0; i < g.experts.size(); ++i)
    counts_[size_t(expert_owner(g.experts[i], size_))] += g.rows_of(i).size() * L * sizeof(float);
  // Pack this rank's rows: its experts ascending, each expert's rows ascending. Every rank unpacks
  // another's bytes walking the same groups in the same order.
  mine_.clear();
  for (size_t i = 0; i < g.experts.size(); ++i)
    if (owns(g.experts[i]))
      for (uint32_t row : g.rows_of(i))
        mine_.insert(mine_.end(), eout.begin() + ptrdiff_t(row * L), eout.begin() + ptrdiff_t((row + 1) * L));
  stats_.rows_computed += mine_.size() / L;
  size_t total = 0;
  for (size_t b : counts_) total += b;
  all_.resize(total / sizeof(float));
  if (size_ == 1) return;  // nothing to exchange: every expert is here

  const auto t0 = std::chrono::steady_clock::now();
  comm_.allgatherv(std::as_bytes(std::span<const float>(mine_)), counts_,
                   std::as_writable_bytes(std::span(all_)), kExpertExchange);
  stats_.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ++stats_.messages;
  stats_.bytes_sent += counts_[size_t(rank_)];
  stats_.bytes_received += total - counts_[size_t(rank_)];

  std::vector<size_t> at(static_cast<size_t>(size_), 0);  // each rank's next float in all_
  for (int r = 1; r < size_; ++r) at[size_t(r)] = at[size_t(r - 1)] + counts_[size_t(r - 1)] / sizeof(float);
  for (size_t i = 0; i < g.experts.size(); ++i) {
    const int o = expert_owner(g.experts[i], size_);
    if (o == rank_) continue;  // computed here, already in place
    for (uint32_t row : g.rows_of(i)) {
      std::copy_n(all_.begin() + ptrdiff_t(at[size_t(o)]), L, eout.begin() + ptrdiff_t(row * L));
      at[size_t(o)] += L;
    }
  }
}

}  // namespace k3::pipeline::ranks
