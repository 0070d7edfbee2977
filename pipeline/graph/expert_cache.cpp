#include "pipeline/graph/expert_cache.hpp"

#include "io/error.hpp"

namespace k3::pipeline {

ExpertCache::ExpertCache(NoStorage, uint64_t slots, int n_layers, int n_experts, ExpertPolicy policy)
    : slot_bytes_(0), widen_floats_(0), n_experts_(n_experts) {
  if (slots == 0) throw io::runtime_error("expert cache: no slots planned (internal error)");
  slots_.resize(slots);
  slot_of_.assign(size_t(n_layers) * size_t(n_experts), -1);
  for (int32_t s = int32_t(slots) - 1; s >= 0; --s) empty_.push_back(s);
  policy_ = make_cache_policy(policy, slots, n_layers, n_experts);
}

ExpertCache::ExpertCache(uint64_t slots, uint64_t slot_bytes, uint64_t widen_floats, int n_layers,
                         int n_experts, ExpertPolicy policy)
    : ExpertCache(NoStorage{}, slots, n_layers, n_experts, policy) {
  if (slot_bytes == 0) throw io::runtime_error("expert cache: no slots planned (internal error)");
  slot_bytes_ = slot_bytes;
  widen_floats_ = widen_floats;
  arena_ = io::AlignedBuffer(slots * slot_bytes);
  widen_.assign(slots * widen_floats, 0.0f);
}

ExpertCache ExpertCache::bookkeeping(uint64_t slots, int n_layers, int n_experts, ExpertPolicy policy) {
  return ExpertCache(NoStorage{}, slots, n_layers, n_experts, policy);
}

std::span<std::byte> ExpertCache::bytes(int slot) {
  return arena_.bytes().subspan(uint64_t(slot) * slot_bytes_, slot_bytes_);
}

std::span<float> ExpertCache::widen(int slot) {
  return std::span<float>(widen_).subspan(uint64_t(slot) * widen_floats_, widen_floats_);
}

uint64_t ExpertCache::occupied() const {
  std::lock_guard lk(mu_);
  return occupied_;
}

int ExpertCache::victim() {
  if (!empty_.empty()) {
    const int s = empty_.back();
    empty_.pop_back();
    ++occupied_;
    return s;
  }
  const int s = policy_->victim();
  if (s < 0) return -1;
  slot_of_[size_t(slots_[size_t(s)].key)] = -1;  // evicted
  return s;
}

ExpertCache::Result ExpertCache::request(int layer, int expert, int tag) {
  std::lock_guard lk(mu_);
  const int32_t k = key(layer, expert);
  policy_->requested(layer, k);
  if (const int s = slot_of_[size_t(k)]; s >= 0) {
    Slot& x = slots_[size_t(s)];
    Result r{x.state == State::ready ? Found::ready : Found::inflight, s, x.prefetched};
    x.prefetched = false;
    if (x.state == State::ready && x.pins == 0) policy_->pinned(s);
    ++x.pins;
    if (x.state == State::inflight) {
      x.waiter = true;
      x.tag = tag;
    }
    return r;
  }
  const int s = victim();
  if (s < 0) return Result{};
  Slot& x = slots_[size_t(s)];
  x.key = k;
  x.state = State::inflight;
  x.pins = 1;
  x.waiter = true;
  x.tag = tag;
  x.prefetched = false;
  slot_of_[size_t(k)] = s;
  policy_->filled(s, layer, k, false);
  return Result{Found::claimed, s, false};
}

ExpertCache::Result ExpertCache::prefetch(int layer, int expert) {
  std::lock_guard lk(mu_);
  const int32_t k = key(layer, expert);
  if (const int s = slot_of_[size_t(k)]; s >= 0)
    return Result{slots_[size_t(s)].state == State::ready ? Found::ready : Found::inflight, s, false};
  const int s = victim();
  if (s < 0) return Result{};
  Slot& x = slots_[size_t(s)];
  x.key = k;
  x.state = State::inflight;
  x.pins = 0;
  x.waiter = false;
  x.tag = -1;
  x.prefetched = true;
  slot_of_[size_t(k)] = s;
  policy_->filled(s, layer, k, true);
  return Result{Found::claimed, s, true};
}

int ExpertCache::landed(int slot, bool ok) {
  std::lock_guard lk(mu_);
  Slot& x = slots_[size_t(slot)];
  const int tag = x.waiter ? x.tag : -1;
  x.waiter = false;
  x.tag = -1;
  if (!ok) {  // nothing of it may be used; the run is failing anyway
    slot_of_[size_t(x.key)] = -1;
    x.key = -1;
    x.state = State::empty;
    x.prefetched = false;
    if (x.pins == 0) {
      empty_.push_back(slot);
      --occupied_;
    }
    return tag;
  }
  x.state = State::ready;
  if (x.pins == 0) policy_->evictable(slot);
  return tag;
}

bool ExpertCache::release(int slot) {
  std::lock_guard lk(mu_);
  Slot& x = slots_[size_t(slot)];
  if (x.pins == 0) throw io::runtime_error("expert cache: release of an unpinned slot (internal error)");
  if (--x.pins > 0) return false;
  if (x.state == State::ready) {
    policy_->evictable(slot);
  } else if (x.state == State::empty) {
    empty_.push_back(slot);
    --occupied_;
  }
  return true;
}

}  // namespace k3::pipeline
