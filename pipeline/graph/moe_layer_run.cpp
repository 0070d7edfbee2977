#include "pipeline/graph/moe_layer_run.hpp"

namespace k3::pipeline {

void MoeLayerRun::begin(Visit v, std::span<const int32_t> idx, const io::ModelConfig& c, int other_pieces,
                        const stages::ExpertExchange* owner) {
  std::lock_guard lk(mu_);
  visit_ = v;
  owner_ = owner;
  if (!owner) {
    stages::group_by_expert(idx, groups_);
  } else {  // the owned groups, in the same ascending order, with the same rows
    stages::group_by_expert(idx, all_);
    groups_.experts.clear();
    groups_.rows.clear();
    groups_.begin.assign(1, 0);
    for (size_t i = 0; i < all_.experts.size(); ++i) {
      if (!owner->owns(all_.experts[i])) continue;
      const std::span<const uint32_t> rows = all_.rows_of(i);
      groups_.experts.push_back(all_.experts[i]);
      groups_.rows.insert(groups_.rows.end(), rows.begin(), rows.end());
      groups_.begin.push_back(uint32_t(groups_.rows.size()));
    }
  }
  const size_t U = unique();
  slot_.assign(U, -1);
  apply_off_.resize(U);
  size_t off = 0;
  for (size_t i = 0; i < U; ++i) {
    apply_off_[i] = off;
    off += stages::expert_apply_scratch(c, groups_.rows_of(i).size());
  }
  next_pending_ = wave_pending_ = 0;
  held_.clear();
  unbound_.clear();
  computing_ = 0;
  shared_started_ = fetched_ = false;
  remaining_.store(int(U) + other_pieces);
}

MoeLayerRun::Claim MoeLayerRun::claim(Visit v, ExpertCache& cache, ExpertCounters& counts,
                                      std::vector<int>& hit_groups, graph_detail::ReadBatch& batch) {
  Claim out;
  std::lock_guard lk(mu_);
  if (v.step != visit_.step || v.layer != visit_.layer) {  // a stale retry
    out.stale = true;
    return out;
  }
  out.first = !fetched_;
  fetched_ = true;
  while (next_pending_ < unique()) {
    const int gi = int(next_pending_);
    const int e = groups_.experts[size_t(gi)];
    const ExpertCache::Result r = cache.request(visit_.layer, e, gi);
    if (r.found == ExpertCache::Found::full) break;  // retried when a slot frees
    ++counts.requests;
    if (r.found != ExpertCache::Found::claimed) ++counts.hits;
    if (r.was_prefetch) ++counts.used;
    slot_[size_t(gi)] = r.slot;
    ++next_pending_;
    ++wave_pending_;
    if (r.found == ExpertCache::Found::ready) hit_groups.push_back(gi);
    if (r.found == ExpertCache::Found::claimed)
      batch.items.push_back(graph_detail::ReadItem{visit_, r.slot, visit_.layer, e, false});
  }
  return out;
}

bool MoeLayerRun::computed() {
  std::lock_guard lk(mu_);
  const bool wave_computed = --computing_ == 0;
  // serial: the next wave is read once this one is computed, not as its first slot frees
  return next_pending_ < unique() && (waves_ != Waves::serial || wave_computed);
}

}  // namespace k3::pipeline
