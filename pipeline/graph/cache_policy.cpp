#include "pipeline/graph/cache_policy.hpp"

#include <bit>
#include <limits>

#include "io/error.hpp"

namespace k3::pipeline {

ExpertPolicy parse_expert_policy(std::string_view name) {
  if (name == "lru") return ExpertPolicy::lru;
  if (name == "run") return ExpertPolicy::run;
  throw io::usage_error("--expert-policy: unknown policy '" + std::string(name) + "' (lru, run)");
}

const char* expert_policy_name(ExpertPolicy p) {
  return p == ExpertPolicy::lru ? "lru" : "run";
}

std::unique_ptr<CachePolicy> make_cache_policy(ExpertPolicy p, uint64_t slots, int n_layers, int n_experts) {
  if (p == ExpertPolicy::lru) return std::make_unique<LruPolicy>(slots);
  return std::make_unique<RunPolicy>(slots, n_layers, n_experts);
}

LruPolicy::LruPolicy(uint64_t slots) : links_(slots) {}

void LruPolicy::evictable(int s) {
  Link& x = links_[size_t(s)];
  x.prev = tail_;
  x.next = -1;
  if (tail_ >= 0)
    links_[size_t(tail_)].next = s;
  else
    head_ = s;
  tail_ = s;
}

void LruPolicy::pinned(int s) {
  Link& x = links_[size_t(s)];
  if (x.prev >= 0)
    links_[size_t(x.prev)].next = x.next;
  else
    head_ = x.next;
  if (x.next >= 0)
    links_[size_t(x.next)].prev = x.prev;
  else
    tail_ = x.prev;
  x.prev = x.next = -1;
}

int LruPolicy::victim() {
  if (head_ < 0) return -1;
  const int s = head_;
  pinned(s);
  return s;
}

RunPolicy::RunPolicy(uint64_t slots, int n_layers, int n_experts)
    : slots_(slots),
      visits_(size_t(n_layers), 0),
      visit_size_(size_t(n_layers), 0),
      history_(size_t(n_layers) * size_t(n_experts), 0),
      seen_(size_t(n_layers) * size_t(n_experts), 0) {
  evictable_.reserve(slots);
}

void RunPolicy::requested(int layer, int32_t key) {
  if (layer != last_layer_) {
    if (last_layer_ >= 0) visit_size_[size_t(last_layer_)] = asked_;
    asked_ = 0;
    ++visits_[size_t(layer)];
    last_layer_ = layer;
  }
  const uint64_t v = visits_[size_t(layer)];
  if (seen_[size_t(key)] != v) ++asked_;
  uint64_t& h = history_[size_t(key)];
  const uint64_t since = v - seen_[size_t(key)];
  h = since >= 64 ? 0 : h << since;
  h |= 1;
  seen_[size_t(key)] = v;
}

void RunPolicy::filled(int s, int layer, int32_t key, bool prefetch) {
  SlotInfo& x = slots_[size_t(s)];
  x.key = key;
  x.layer = layer;
  x.filled = ++fills_;
  x.prefetch_visit = prefetch ? visits_[size_t(layer)] + 1 : 0;
}

void RunPolicy::evictable(int s) {
  slots_[size_t(s)].at = int32_t(evictable_.size());
  evictable_.push_back(s);
}

void RunPolicy::pinned(int s) {
  SlotInfo& x = slots_[size_t(s)];
  const int32_t at = x.at;
  const int32_t last = evictable_.back();
  evictable_[size_t(at)] = last;
  slots_[size_t(last)].at = at;
  evictable_.pop_back();
  x.at = -1;
}

RunPolicy::Rank RunPolicy::rank(const SlotInfo& x) const {
  // The visit under way at the layer being requested has not passed while it has asked for fewer
  // experts than the layer's previous visit: the previous visit's experts may still be asked for,
  // so they rank as used at the latest visit. Once as many have been asked for, the visit counts as
  // passed (near one token's worth of slots, keeping them would push out experts of other layers
  // that are sure to stay until their layer's next visit).
  const uint64_t visits = visits_[size_t(x.layer)];
  const bool under_way = x.layer == last_layer_ && asked_ < visit_size_[size_t(x.layer)];
  const uint64_t latest = visits - (under_way && visits > 0 ? 1 : 0);
  const int64_t newest = -int64_t(x.filled);
  if (x.prefetch_visit > latest) return Rank{0, std::numeric_limits<int>::max(), newest};  // not yet due
  const uint64_t seen = seen_[size_t(x.key)];
  if (seen == 0) return Rank{std::numeric_limits<int64_t>::min(), 0, newest};  // never used
  const int64_t recency = seen >= latest ? 0 : -int64_t(latest - seen);
  return Rank{recency, std::countr_one(history_[size_t(x.key)]), newest};
}

int RunPolicy::victim() {
  if (evictable_.empty()) return -1;
  size_t best = 0;
  Rank best_rank = rank(slots_[size_t(evictable_[0])]);
  for (size_t i = 1; i < evictable_.size(); ++i) {
    const Rank r = rank(slots_[size_t(evictable_[i])]);
    if (r < best_rank) {
      best_rank = r;
      best = i;
    }
  }
  const int s = evictable_[best];
  pinned(s);
  return s;
}

}  // namespace k3::pipeline
