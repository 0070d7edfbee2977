// One MoE layer's routed experts while the graph computes it (graph.hpp): which expert groups the
// router chose, which have a slot, which wave is being read, held or computed, and how many pieces
// (groups, shared experts, lookahead) are left before combine may sum them. The graph's nodes
// expert_fetch, expert_landed, expert_compute, shared and lookahead drive it; it owns no weights and
// calls no kernel, so tests/test_moe_layer_run.cpp runs it alone against a real ExpertCache.
//
// Waves: a layer whose unique experts exceed the free slots (prefill at the floor) claims what the
// cache gives, and is re-sent a fetch whenever a slot is released or a prefetch lands; each group is
// claimed once, in group order, so the arithmetic (each expert writes only its own rows) is the same
// whatever the waves.
#pragma once
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <span>
#include <vector>

#include "io/config.hpp"
#include "pipeline/graph/expert_cache.hpp"
#include "pipeline/graph/graph_messages.hpp"
#include "stages/moe.hpp"

namespace k3::pipeline {

// The run's expert counters (StreamTotals).
struct ExpertCounters {
  std::atomic<uint64_t> requests{0}, hits{0};  // hits include experts a prefetch had read / was reading
  std::atomic<uint64_t> predicted{0};          // prefetch reads issued
  std::atomic<uint64_t> used{0};               // of those, experts the router then chose
};

class MoeLayerRun {
 public:
  using Visit = graph_detail::Visit;
  enum class Waves {
    none,    // overlap, lookahead: each expert is computed as its bytes land
    trunk,   // a wave's experts are held until the whole wave has landed; the shared experts start
             // with the first complete wave
    serial,  // as trunk, and a wave's reads are bound only when the wave is complete; the next wave
             // is claimed only once this one is computed (never a read and a compute at once)
  };
  explicit MoeLayerRun(Waves w) : waves_(w) {}

  // router: the layer's top-k choices (`idx`, [T][top_k]) grouped by expert, each group's scratch
  // offset, no slot yet. `other_pieces`: what else must finish before combine (shared, lookahead).
  // `owner` (one rank of several): only the groups of the experts it owns are this run's, so only
  // they are fetched and computed; all_groups() keeps every group, for the exchange.
  void begin(Visit v, std::span<const int32_t> idx, const io::ModelConfig& c, int other_pieces,
             const stages::ExpertExchange* owner = nullptr);

  Visit visit() const { return visit_; }
  // Locked: expert_landed and expert_fetch read it for their trace arguments while the router may
  // be starting the next layer (a late prefetch landing, a stale retry); .ci/tsan found the race.
  int layer() const {
    std::lock_guard lk(mu_);
    return visit_.layer;
  }
  size_t unique() const { return groups_.experts.size(); }
  // Every group the router chose, owned here or not (one process: the same as this run's).
  const stages::ExpertGroups& all_groups() const { return owner_ ? all_ : groups_; }
  int expert(size_t group) const { return groups_.experts[group]; }
  std::span<const uint32_t> rows(size_t group) const { return groups_.rows_of(group); }
  size_t apply_offset(size_t group) const { return apply_off_[group]; }
  int slot(size_t group) const { return slot_[group]; }

  // expert_fetch: claims slots for the waiting groups, in group order, until the cache is full.
  // Resident groups go to `hit_groups`, claimed slots to `batch` as reads; an in-flight prefetch is
  // neither (its landing names the group). `stale`: the message was for a layer already done.
  struct Claim {
    bool stale = false;
    bool first = false;  // the layer's first fetch
  };
  Claim claim(Visit v, ExpertCache& cache, ExpertCounters& counts, std::vector<int>& hit_groups,
              graph_detail::ReadBatch& batch);

  // serial: whether the landing about to be handled completes the wave (it then binds the wave).
  // Known on entry: a wave's claims are all counted before its first read or hit is sent, and the
  // next wave is claimed only once this one is computed.
  bool completes_wave() {
    std::lock_guard lk(mu_);
    return wave_pending_ == 1;
  }

  // A prefetch landed (one more evictable slot): f(visit) if this layer still waits for slots.
  template <class F>
  void if_waiting_for_slots(F&& f) {
    std::lock_guard lk(mu_);
    if (next_pending_ < unique()) f(visit_);
  }

  // expert_landed: group `group`'s bytes are bound (a read or a hit), or -- serial -- a read into
  // `unbound_slot` landed and is bound only when its wave is complete, by bind(slot) -> group.
  // Appends the groups to compute now to `go` (all of a wave at once, or this one); `start_shared`:
  // the shared experts of `visit` start now (trunk: with the first complete wave).
  struct Landed {
    Visit visit;
    bool start_shared = false;
  };
  template <class Bind>
  Landed landed(int group, int unbound_slot, Bind&& bind, std::vector<graph_detail::ExpertGo>& go) {
    bool start_shared = false;
    std::lock_guard lk(mu_);
    const Visit v = visit_;
    if (waves_ == Waves::none) {
      go.push_back(graph_detail::ExpertGo{v, group, slot_[size_t(group)]});
    } else {
      if (unbound_slot >= 0)
        unbound_.push_back(unbound_slot);
      else
        held_.push_back(group);
      if (--wave_pending_ == 0) {  // the whole wave has landed
        for (int s : unbound_) held_.push_back(bind(s));
        unbound_.clear();
        for (int h : held_) go.push_back(graph_detail::ExpertGo{v, h, slot_[size_t(h)]});
        held_.clear();
        start_shared = waves_ == Waves::trunk && !shared_started_;
        shared_started_ = true;
      }
    }
    computing_ += go.size();
    return Landed{v, start_shared};
  }

  // expert_compute: one group computed (its slot released). True when expert_fetch should claim
  // more: groups wait for slots and (serial) this wave is all computed, not just its first slot.
  bool computed();

  // A piece (group, shared, lookahead) is done; true for the layer's last one.
  bool piece_done() { return --remaining_ == 0; }

  // lookahead: this layer still waits for slots (a prefetch then must not take one).
  bool starving() {
    std::lock_guard lk(mu_);
    return next_pending_ < unique();
  }

 private:
  const Waves waves_;
  mutable std::mutex mu_;  // mutable: layer() locks it
  Visit visit_{~uint64_t{0}, -1};
  stages::ExpertGroups groups_;
  stages::ExpertGroups all_;  // one rank of several: every group; groups_ holds the owned ones
  const stages::ExpertExchange* owner_ = nullptr;
  std::vector<int> slot_;
  std::vector<size_t> apply_off_;
  size_t next_pending_ = 0;   // groups [next_pending_, unique) wait for a free slot
  size_t wave_pending_ = 0;   // trunk / serial: claimed groups whose bytes have not landed
  std::vector<int> held_;     // trunk / serial: landed groups held until their wave is complete
  std::vector<int> unbound_;  // serial: landed reads' slots, bound when their wave is complete
  size_t computing_ = 0;      // groups sent to expert_compute and not yet computed
  bool shared_started_ = false, fetched_ = false;
  std::atomic<int> remaining_{0};  // pieces left: groups + shared (+ lookahead)
};

}  // namespace k3::pipeline
