#include "pipeline/graph/slot_pool.hpp"

#include <fmt/format.h>
#include <sys/mman.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "io/error.hpp"

namespace k3::pipeline {

using io::align_up;
using io::kDirectAlign;

SparseRegion::SparseRegion(uint64_t bytes) {
  if (bytes == 0) return;
  const size_t size = align_up(bytes, kDirectAlign);
  void* m = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (m == MAP_FAILED)
    throw io::runtime_error(
        fmt::format("cannot reserve {} bytes of address space: {}", size, std::strerror(errno)));
  ::madvise(m, size, MADV_NOHUGEPAGE);  // advice only: a host without THP is fine
  data_ = static_cast<std::byte*>(m);
  size_ = size;
}

SparseRegion::SparseRegion(SparseRegion&& o) noexcept
    : data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)) {}

SparseRegion& SparseRegion::operator=(SparseRegion&& o) noexcept {
  if (this != &o) {
    if (data_) ::munmap(data_, size_);
    data_ = std::exchange(o.data_, nullptr);
    size_ = std::exchange(o.size_, 0);
  }
  return *this;
}

SparseRegion::~SparseRegion() {
  if (data_) ::munmap(data_, size_);
}

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
  compressed_ = !p.codec.empty();
  dec_ = p.decode_slots;
  dec_slot_ = p.decode_slot_bytes;
  dec_widen_ = p.decode_widen_bytes / 4;
  dec_stride_ = p.decode_slot_span ? p.decode_slot_span : dec_slot_;
  stored_.assign(static_cast<size_t>(n), 0);
  for (int l = 0; l < n; ++l) stored_[size_t(l)] = src.layer(l).stored_bytes;

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
  for (int l = 0; l < n && compressed_; ++l) {
    const LayerSource& L = src.layer(l);
    const bool fits =
        ring_ >= 1 && L.stored_bytes <= uint64_t(ring_) * slot_ &&
        (pinned(l) || (L.slot_bytes <= dec_stride_ && L.layout.widen_floats <= dec_widen_ && dec_ >= 1));
    if (!fits)
      throw io::runtime_error(fmt::format(
          "graph: compressed layer {} needs {} stored bytes (ring {} x {}) and {} decoded bytes + {} widen "
          "floats "
          "(decode slots {} x {} + {}) (internal sizing error)",
          l, L.stored_bytes, ring_, slot_, L.slot_bytes, L.layout.widen_floats, dec_, dec_stride_,
          dec_widen_));
  }
  for (int l = 0; l < n && !compressed_; ++l) {
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
  if (dec_ > 0) {
    if (p.decode_slot_span) {
      dec_sparse_ = SparseRegion(uint64_t(dec_) * dec_stride_);
      dec_bytes_ = dec_sparse_.bytes();
    } else {
      dec_mem_ = io::AlignedBuffer(uint64_t(dec_) * dec_slot_);
      dec_bytes_ = dec_mem_.bytes();
    }
    dec_widen_mem_.assign(uint64_t(dec_) * dec_widen_, 0.0f);
    dec_holders_ = std::make_unique<Holder[]>(static_cast<size_t>(dec_));
  }
  if (n_pinned > 0) {
    pin_mem_ = io::AlignedBuffer(pin_bytes);
    pin_widen_.assign(pin_floats, 0.0f);
    pin_holders_ = std::make_unique<Holder[]>(static_cast<size_t>(n_pinned));
  }
}

int TrunkSlots::parts(int layer) const {
  if (compressed_) return stored_.at(size_t(layer)) > slot_ ? ring_ : 1;
  return layer == spanning_ ? ring_ : 1;
}

std::span<std::byte> TrunkSlots::read_target(int layer, int slot) {
  if (!compressed_) return bytes(layer, slot);
  if (parts(layer) > 1) return ring_mem_.bytes();
  return ring_mem_.bytes().subspan(uint64_t(slot) * slot_, slot_);
}

std::span<std::byte> TrunkSlots::bytes(int layer, int slot) {
  if (slot < 0) return pin_mem_.bytes().subspan(pin_off_.at(size_t(layer)), pin_size_[size_t(layer)]);
  if (compressed_) return dec_bytes_.subspan(uint64_t(slot) * dec_stride_, dec_stride_);
  if (layer == spanning_) return ring_mem_.bytes();
  return ring_mem_.bytes().subspan(uint64_t(slot) * slot_, slot_);
}

std::span<float> TrunkSlots::widen(int layer, int slot) {
  if (slot < 0) {
    const size_t i = size_t(layer);
    return std::span<float>(pin_widen_).subspan(pin_widen_off_[i], pin_widen_n_[i]);
  }
  if (compressed_) return std::span<float>(dec_widen_mem_).subspan(uint64_t(slot) * dec_widen_, dec_widen_);
  return std::span<float>(ring_widen_).subspan(uint64_t(slot) * slot_widen_, slot_widen_);
}

TrunkSlots::Holder& TrunkSlots::holder(int layer, int slot) {
  if (slot < 0) return pin_holders_[size_t(pin_index_.at(size_t(layer)))];
  if (compressed_) return dec_holders_[size_t(slot)];
  return ring_holders_[size_t(slot)];
}

TrunkSlots::Holder& TrunkSlots::read_holder(int layer, int slot) {
  if (compressed_) return ring_holders_[size_t(slot)];
  return holder(layer, slot);
}

const TrunkSlots::Holder* TrunkSlots::find_bound(int layer, uint64_t visit) const {
  if (layer < 0 || size_t(layer) >= pin_off_.size()) return nullptr;
  if (pinned(layer)) {
    const Holder& h = pin_holders_[size_t(pin_index_[size_t(layer)])];
    return pin_loaded(layer) ? &h : nullptr;
  }
  const Holder* hs = compressed_ ? dec_holders_.get() : ring_holders_.get();
  for (int s = 0; s < (compressed_ ? dec_ : ring_); ++s)
    if (hs[size_t(s)].visit.load(std::memory_order_acquire) == visit) return &hs[size_t(s)];
  return nullptr;
}

}  // namespace k3::pipeline
