// Routed experts in whole packed slots (docs/engine.md §3.5, docs/design.md §3.4): one arena of N slots --
// the plan's in-flight + lookahead + cache slots, a single pool, so that whatever the current layer
// does not hold serves as cache -- keyed by (layer, expert).
//
// Slot states: EMPTY, INFLIGHT (a read owns the slot's bytes; never a second read into one slot --
// the bug that once gave the reference a wrong token), READY. A slot the current layer has claimed
// is pinned (a count) until its expert has been computed, and is never a victim. A victim is the
// first EMPTY slot, else the unpinned READY slot the replacement policy picks (cache_policy.hpp).
// A lookahead prefetch claims a victim without pinning it; if the router then asks for that expert
// while it is still INFLIGHT, the request pins it and waits for its landing (it is not read twice).
//
// Every method takes the cache's own lock; each is a handful of list operations.
#pragma once
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <vector>

#include "io/aligned.hpp"
#include "pipeline/graph/cache_policy.hpp"
#include "stages/bind.hpp"

namespace k3::pipeline {

class ExpertCache {
 public:
  ExpertCache(uint64_t slots, uint64_t slot_bytes, uint64_t widen_floats, int n_layers, int n_experts,
              ExpertPolicy policy = kDefaultExpertPolicy);
  // The same slots, states and policy with no bytes behind them: what `k3flow cache-sim` replays a
  // routing trace through (bytes() and widen() must not be called).
  static ExpertCache bookkeeping(uint64_t slots, int n_layers, int n_experts, ExpertPolicy policy);
  ExpertCache(ExpertCache&&) = delete;

  enum class Found {
    ready,     // resident: pinned for the caller
    inflight,  // being read (a prefetch): pinned, the caller is told when it lands
    claimed,   // a victim slot now INFLIGHT for this key: the caller reads into it
    full,      // every slot is pinned or being read: try again after a release / landing
  };
  struct Result {
    Found found = Found::full;
    int slot = -1;
    bool was_prefetch = false;  // the slot was filled (or is being filled) by a lookahead prefetch
  };

  // For the layer being computed: pins the slot; `tag` is returned by landed() for an INFLIGHT hit
  // or a claim.
  Result request(int layer, int expert, int tag);
  // For a lookahead prefetch: never pins, never waits; `ready` / `inflight` mean nothing to do.
  Result prefetch(int layer, int expert);

  // A read into `slot` finished: READY (ok) or EMPTY. Returns the waiter's tag, or -1 when no
  // request waits (then the slot has become evictable).
  int landed(int slot, bool ok);
  // The caller is done with a slot it had pinned. Returns true when it became evictable.
  bool release(int slot);

  std::span<std::byte> bytes(int slot);
  std::span<float> widen(int slot);
  // Bound views over the slot's bytes, written by the landing node while the slot is INFLIGHT.
  stages::ExpertWeights& weights(int slot) { return slots_[size_t(slot)].w; }

  uint64_t slot_count() const { return slots_.size(); }
  uint64_t slot_bytes() const { return slot_bytes_; }
  uint64_t arena_bytes() const { return arena_.size() + 4 * widen_.size(); }
  uint64_t occupied() const;  // slots not EMPTY

 private:
  enum class State : uint8_t { empty, inflight, ready };
  struct Slot {
    int32_t key = -1;
    State state = State::empty;
    bool waiter = false, prefetched = false;
    int tag = -1;
    uint32_t pins = 0;
    stages::ExpertWeights w;
  };
  struct NoStorage {};
  ExpertCache(NoStorage, uint64_t slots, int n_layers, int n_experts, ExpertPolicy policy);
  int victim();  // pops an EMPTY slot or the policy's victim, or -1
  int32_t key(int layer, int expert) const { return layer * n_experts_ + expert; }

  mutable std::mutex mu_;
  uint64_t slot_bytes_, widen_floats_;
  int n_experts_;
  io::AlignedBuffer arena_;
  std::vector<float> widen_;
  std::vector<Slot> slots_;
  std::vector<int32_t> slot_of_;  // key -> slot, -1 when absent
  std::vector<int32_t> empty_;    // stack of EMPTY slots
  std::unique_ptr<CachePolicy> policy_;
  uint64_t occupied_ = 0;
};

}  // namespace k3::pipeline
