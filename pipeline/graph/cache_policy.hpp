// Which unpinned READY slot of the expert cache (expert_cache.hpp) a new expert replaces. The cache
// owns the slots, their states and pins; a policy sees only which slots may be evicted and which
// (layer, expert) keys are requested, and picks the victim. A policy decides what is read, never
// what is computed: every policy gives the same ids and logits.
//
//   lru  the least recently used evictable slot.
//   run  layer-aware recency/frequency (the default). Each layer keeps a visit count (a visit: a run
//        of requests to that layer); each key keeps a bit history of the visits of its layer that
//        used it. The victim is the slot whose key is least likely to be used at its layer's next
//        visit, ranked by (a) not used at the layer's latest visit, the longer ago the worse, then
//        (b) the length of its current run of consecutive visits, shortest first, then (c) the most
//        recently filled first, so an expert seen once does not push out one that has stayed in use.
//        The visit under way counts as not yet passed (its layer's previous experts rank as used at
//        the latest visit) until it has asked for as many experts as that layer's previous visit.
//        Why: on Kimi K3's routing (docs/routing.md) an expert used at the previous token is used
//        again with probability ~0.3 after one use, ~0.5 after two to four consecutive uses and more
//        after longer runs, but only ~0.1 when the previous token skipped it; LRU keeps whatever was
//        read last, and a token's 1,472 reads flush every cache smaller than one token.
//        The history outlives eviction (one word per key), so an evicted expert that returns
//        resumes its run. Nothing depends on expert ids or on the order of positions.
#pragma once
#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

namespace k3::pipeline {

enum class ExpertPolicy { lru, run };
inline constexpr ExpertPolicy kDefaultExpertPolicy = ExpertPolicy::run;
ExpertPolicy parse_expert_policy(std::string_view name);  // usage Error listing the names
const char* expert_policy_name(ExpertPolicy);

class CachePolicy {
 public:
  virtual ~CachePolicy() = default;
  // A request (hit or miss) for `key` of `layer` by the layer being computed.
  virtual void requested(int layer, int32_t key) = 0;
  // `slot` now holds `key` (a read claimed it); `prefetch`: a lookahead read, not yet requested.
  virtual void filled(int slot, int layer, int32_t key, bool prefetch) = 0;
  virtual void evictable(int slot) = 0;  // READY and unpinned
  virtual void pinned(int slot) = 0;     // was evictable, is no longer
  virtual int victim() = 0;              // removes and returns an evictable slot, or -1
};

std::unique_ptr<CachePolicy> make_cache_policy(ExpertPolicy, uint64_t slots, int n_layers, int n_experts);

class LruPolicy final : public CachePolicy {
 public:
  explicit LruPolicy(uint64_t slots);
  void requested(int, int32_t) override {}
  void filled(int, int, int32_t, bool) override {}
  void evictable(int slot) override;
  void pinned(int slot) override;
  int victim() override;

 private:
  struct Link {
    int32_t prev = -1, next = -1;
  };
  std::vector<Link> links_;  // list of evictable slots, oldest first (intrusive, O(1))
  int32_t head_ = -1, tail_ = -1;
};

class RunPolicy final : public CachePolicy {
 public:
  RunPolicy(uint64_t slots, int n_layers, int n_experts);
  void requested(int layer, int32_t key) override;
  void filled(int slot, int layer, int32_t key, bool prefetch) override;
  void evictable(int slot) override;
  void pinned(int slot) override;
  int victim() override;

 private:
  struct SlotInfo {
    int32_t key = -1;
    int layer = -1;
    int32_t at = -1;  // index in evictable_, -1 when not evictable
    uint64_t filled = 0;
    uint64_t prefetch_visit = 0;  // a prefetch fills for its layer's next visit (0: not a prefetch)
  };
  // Smaller = evicted first.
  struct Rank {
    int64_t recency = 0;  // 0 when used at its layer's latest visit, else -(visits since)
    int run = 0;
    int64_t newest = 0;  // -(fill order): the most recently filled goes first
    bool operator<(const Rank& o) const {
      if (recency != o.recency) return recency < o.recency;
      if (run != o.run) return run < o.run;
      return newest < o.newest;
    }
  };
  Rank rank(const SlotInfo&) const;

  std::vector<SlotInfo> slots_;
  std::vector<int32_t> evictable_;
  std::vector<uint64_t> visits_;      // per layer: visits so far
  std::vector<uint32_t> visit_size_;  // per layer: distinct keys its latest finished visit asked for
  std::vector<uint64_t> history_;     // per key: bit i = used at its layer's visit (seen_ - i)
  std::vector<uint64_t> seen_;        // per key: the visit bit 0 stands for (0: never used)
  int last_layer_ = -1;
  uint32_t asked_ = 0;  // distinct keys the visit under way (at last_layer_) has asked for
  uint64_t fills_ = 0;
};

}  // namespace k3::pipeline
