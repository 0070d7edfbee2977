#include "pipeline/graph/slot_pool.hpp"

#include <fmt/format.h>

#include "io/error.hpp"

namespace k3::pipeline {

using io::align_up;
using io::kDirectAlign;

TrunkSlots::TrunkSlots(const MemoryPlan& p, const WeightSources& src) {
  const int n = src.n_layers();
  ring_ = p.ring_slots;
  spanning_ = p.spanning_layer;
  slot_ = p.slot_read_bytes;
  slot_widen_ = p.slot_widen_bytes / 4;
  pin_off_.assign(static_cast<size_t>(n), kNotPinned);
  pin_widen_off_.assign(static_cast<size_t>(n), 0);
  pin_size_.assign(static_cast<size_t>(n), 0);
  pin_widen_n_.assign(static_cast<size_t>(n), 0);
  pin_index_.assign(static_cast<size_t>(n), -1);
  pin_loaded_ = std::make_unique<std::atomic<bool>[]>(static_cast<size_t>(n));

  uint64_t pin_bytes = 0, pin_floats = 0;
  int n_pinned = 0;
  for (int l : p.pinned) {
    if (l >= n) continue;
    const LayerSource& L = src.layer(l);
    pin_off_[size_t(l)] = pin_bytes;
    pin_size_[size_t(l)] = L.slot_bytes;
    pin_widen_off_[size_t(l)] = pin_floats;
    pin_widen_n_[size_t(l)] = L.layout.widen_floats;
    pin_index_[size_t(l)] = n_pinned++;
    pin_bytes += align_up(L.slot_bytes, kDirectAlign);
    pin_floats += align_up(L.layout.widen_floats, 1024);  // 4096-byte granules, as the planner counts
  }
  for (int l = 0; l < n; ++l) {
    if (pinned(l)) continue;
    const LayerSource& L = src.layer(l);
    const uint64_t room = l == spanning_ ? uint64_t(ring_) * slot_ : slot_;
    if (ring_ < 1 || L.slot_bytes > room || L.layout.widen_floats > slot_widen_)
      throw io::runtime_error(
          fmt::format("graph: layer {} needs {} slot bytes + {} widen floats, the plan's ring gives {} x {} "
                      "+ {} (internal "
                      "sizing error)",
                      l, L.slot_bytes, L.layout.widen_floats, ring_, slot_, slot_widen_));
  }
  if (ring_ > 0) {
    ring_mem_ = io::AlignedBuffer(uint64_t(ring_) * slot_);
    ring_widen_.assign(uint64_t(ring_) * slot_widen_, 0.0f);
    ring_holders_ = std::make_unique<Holder[]>(static_cast<size_t>(ring_));
  }
  if (n_pinned > 0) {
    pin_mem_ = io::AlignedBuffer(pin_bytes);
    pin_widen_.assign(pin_floats, 0.0f);
    pin_holders_ = std::make_unique<Holder[]>(static_cast<size_t>(n_pinned));
  }
}

std::span<std::byte> TrunkSlots::bytes(int layer, int slot) {
  if (slot < 0) return pin_mem_.bytes().subspan(pin_off_.at(size_t(layer)), pin_size_[size_t(layer)]);
  if (layer == spanning_) return ring_mem_.bytes();
  return ring_mem_.bytes().subspan(uint64_t(slot) * slot_, slot_);
}

std::span<float> TrunkSlots::widen(int layer, int slot) {
  if (slot < 0) {
    const size_t i = size_t(layer);
    return std::span<float>(pin_widen_).subspan(pin_widen_off_[i], pin_widen_n_[i]);
  }
  return std::span<float>(ring_widen_).subspan(uint64_t(slot) * slot_widen_, slot_widen_);
}

TrunkSlots::Holder& TrunkSlots::holder(int layer, int slot) {
  if (slot < 0) return pin_holders_[size_t(pin_index_.at(size_t(layer)))];
  return ring_holders_[size_t(slot)];
}

const TrunkSlots::Holder* TrunkSlots::find_bound(int layer, uint64_t visit) const {
  if (layer < 0 || size_t(layer) >= pin_off_.size()) return nullptr;
  if (pinned(layer)) {
    const Holder& h = pin_holders_[size_t(pin_index_[size_t(layer)])];
    return pin_loaded(layer) ? &h : nullptr;
  }
  for (int s = 0; s < ring_; ++s)
    if (ring_holders_[size_t(s)].visit.load(std::memory_order_acquire) == visit)
      return &ring_holders_[size_t(s)];
  return nullptr;
}

}  // namespace k3::pipeline
