#include "pipeline/serve/prompt_cache.hpp"

#include <algorithm>
#include <cstring>

namespace k3::pipeline::serve {

namespace {

bool starts_with(std::span<const int32_t> whole, std::span<const int32_t> prefix) {
  return prefix.size() <= whole.size() &&
         (prefix.empty() || std::memcmp(whole.data(), prefix.data(), prefix.size_bytes()) == 0);
}

}  // namespace

const BatchEngine::Snapshot* PromptCache::lookup(std::span<const int32_t> prompt) {
  ++clock_;
  Entry* best = nullptr;
  for (Entry& e : entries_)
    if (e.ids.size() < prompt.size() && (!best || e.ids.size() > best->ids.size()) &&
        starts_with(prompt, e.ids))
      best = &e;
  if (!best) {
    ++stats_.misses;
    return nullptr;
  }
  best->last_use = clock_;
  ++stats_.hits;
  stats_.hit_tokens += best->ids.size();
  return &best->state;
}

const PromptCache::Entry* PromptCache::find_exact(std::span<const int32_t> ids) const {
  for (const Entry& e : entries_)
    if (e.ids.size() == ids.size() && starts_with(ids, e.ids)) return &e;
  return nullptr;
}

bool PromptCache::make_room(std::span<const int32_t> ids, uint64_t state_bytes) {
  const uint64_t need = state_bytes + 4 * uint64_t(ids.size());
  if (ids.empty() || need > budget_ || find_exact(ids)) return false;
  while (!entries_.empty() && bytes_ + need > budget_) evict_one();
  return true;
}

void PromptCache::evict_one() {
  // The least valuable: fewest positions per use-tick of age (positions / (1 + age)), compared
  // without division: a.pos * (1 + age_b) < b.pos * (1 + age_a).
  auto worse = [&](const Entry& a, const Entry& b) {
    const uint64_t age_a = clock_ - a.last_use, age_b = clock_ - b.last_use;
    return uint64_t(a.ids.size()) * (1 + age_b) < uint64_t(b.ids.size()) * (1 + age_a);
  };
  const auto victim = std::min_element(entries_.begin(), entries_.end(), worse);
  bytes_ -= victim->bytes();
  entries_.erase(victim);
  ++stats_.evictions;
}

bool PromptCache::insert(std::span<const int32_t> ids, BatchEngine::Snapshot snap) {
  if (ids.size() != snap.positions || !make_room(ids, snap.bytes())) return false;
  Entry e{.ids = std::vector<int32_t>(ids.begin(), ids.end()), .state = std::move(snap), .last_use = clock_};
  bytes_ += e.bytes();
  entries_.push_back(std::move(e));
  ++stats_.inserts;
  return true;
}

}  // namespace k3::pipeline::serve
