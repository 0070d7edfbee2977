// The trunk's memory, allocated once from the plan (docs/design.md §3): the ring -- S uniform slots in
// ONE arena, so that the planner's spanning layer (larger than a slot) can take all S adjacent slots
// -- and one exact region per pinned layer, in a second arena. The graph moves slot ids between its
// free list and the readers; this class only hands out the bytes behind an id and keeps the weights
// bound in each (a Holder).
//
// Why the spanning layer takes ALL S slots rather than `span_slots` of them: free slots come back in
// consumption order, so with S > 2 the `span` slots it is granted need not be adjacent; taking the
// whole arena makes adjacency true by construction. The planner already prices this in (while it is
// read or computed no other trunk layer is in memory), and for K3 S = span = 2.
//
// A compressed trunk (planner.hpp, "Compressed trunk"): the ring holds a layer's STORED bytes as read
// (stored()), and a third arena of `decode_slots` uniform slots holds decoded layers: there the
// decode stage writes, the binder binds (with the slot's widen area) and compute reads. Slot ids
// after the decode stage -- in TrunkReady, bytes(), widen(), holder() -- are decoded-slot ids; before
// it, ring-slot ids. Pinned layers are held decoded in their regions, their first read staged through
// the ring (a stored layer larger than a slot, pinned or not, takes the whole ring: parts()).
#pragma once
#include <atomic>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "io/aligned.hpp"
#include "pipeline/graph/planner.hpp"
#include "pipeline/graph/streaming_source.hpp"
#include "stages/bind.hpp"

namespace k3::pipeline {

constexpr uint64_t kNoVisit = ~uint64_t{0};

// Address space reserved without committing memory (MAP_NORESERVE, never zero-filled, 4 KiB pages:
// no huge-page fault pulls in 2 MiB): only pages written become resident. A fused codec's decoded
// slots (MemoryPlan::decode_slot_span): a layer's image spans the slot, but the decode stage writes
// only its staged blocks, the pages the planner counted.
class SparseRegion {
 public:
  SparseRegion() = default;
  explicit SparseRegion(uint64_t bytes);  // throws runtime Error when the mapping fails
  SparseRegion(SparseRegion&& o) noexcept;
  SparseRegion& operator=(SparseRegion&& o) noexcept;
  SparseRegion(const SparseRegion&) = delete;
  SparseRegion& operator=(const SparseRegion&) = delete;
  ~SparseRegion();
  std::span<std::byte> bytes() const { return {data_, size_}; }

 private:
  std::byte* data_ = nullptr;
  size_t size_ = 0;
};

class TrunkSlots {
 public:
  // A layer's bound weights and which visit (call * n_layers + layer) they belong to.
  struct Holder {
    std::atomic<uint64_t> visit{kNoVisit};  // set (release) once bound, reset when the slot is freed
    stages::LayerWeights w;
    std::atomic<int> pending_reads{0};
    std::atomic<bool> read_failed{false};
  };

  // Throws runtime Error if a layer does not fit the slot the plan gives it (an internal error).
  TrunkSlots(const MemoryPlan&, const WeightSources&);

  int ring_slots() const { return ring_; }
  int spanning_layer() const { return spanning_; }
  bool compressed() const { return compressed_; }
  int decode_slots() const { return dec_; }
  // Ring slots a read of `layer` takes: 1, or the whole ring (the spanning layer; compressed: any
  // layer whose stored bytes exceed a slot).
  int parts(int layer) const;
  // Where a read of `layer` lands: raw, bytes(layer, slot); compressed, its ring slot (slot 0 and
  // the whole ring when parts(layer) > 1), `stored_bytes` long.
  std::span<std::byte> read_target(int layer, int slot);
  bool pinned(int layer) const { return pin_off_[static_cast<size_t>(layer)] != kNotPinned; }
  bool pin_loaded(int layer) const { return pin_loaded_[static_cast<size_t>(layer)].load(); }
  void set_pin_loaded(int layer) { pin_loaded_[static_cast<size_t>(layer)].store(true); }

  // The slot memory a layer is bound from: its pin region (slot < 0), ring slot `slot`, or for the
  // spanning layer the whole ring (slot must then be 0); compressed: decoded slot `slot`.
  std::span<std::byte> bytes(int layer, int slot);
  std::span<float> widen(int layer, int slot);
  Holder& holder(int layer, int slot);
  // The holder whose read counters track a read into read_target(layer, slot): holder() when raw,
  // the ring slot's own when compressed (its weights are bound in a decoded slot's holder).
  Holder& read_holder(int layer, int slot);
  uint64_t decode_slot_bytes() const { return dec_slot_; }

  // The holder whose weights are bound for `visit`, or null (lookahead looks ahead with it).
  const Holder* find_bound(int layer, uint64_t visit) const;

  uint64_t ring_bytes() const { return ring_mem_.size() + 4 * ring_widen_.size(); }
  // the decoded slots' resident bytes as planned (sparse slots: the pages the decode stage writes)
  uint64_t decode_bytes() const { return uint64_t(dec_) * dec_slot_ + 4 * dec_widen_mem_.size(); }
  uint64_t pinned_bytes() const { return pin_mem_.size() + 4 * pin_widen_.size(); }
  uint64_t slot_read_bytes() const { return slot_; }

 private:
  static constexpr uint64_t kNotPinned = ~uint64_t{0};
  int ring_ = 0, spanning_ = -1;
  bool compressed_ = false;
  int dec_ = 0;
  uint64_t dec_slot_ = 0, dec_widen_ = 0;  // dec_widen_ in floats
  uint64_t dec_stride_ = 0;                // a decoded slot's bytes (sparse: its span)
  io::AlignedBuffer dec_mem_;
  SparseRegion dec_sparse_;  // instead of dec_mem_ when the plan's decoded slots are sparse
  std::span<std::byte> dec_bytes_;
  std::vector<float> dec_widen_mem_;
  std::unique_ptr<Holder[]> dec_holders_;
  std::vector<uint64_t> stored_;        // per layer (compressed)
  uint64_t slot_ = 0, slot_widen_ = 0;  // slot_widen_ in floats
  io::AlignedBuffer ring_mem_, pin_mem_;
  std::vector<float> ring_widen_, pin_widen_;
  std::vector<uint64_t> pin_off_, pin_widen_off_;  // per layer
  std::vector<uint64_t> pin_size_, pin_widen_n_;
  std::unique_ptr<std::atomic<bool>[]> pin_loaded_;
  std::unique_ptr<Holder[]> ring_holders_, pin_holders_;
  std::vector<int> pin_index_;  // layer -> index into pin_holders_
};

}  // namespace k3::pipeline
