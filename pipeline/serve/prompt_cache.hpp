// `k3flow serve --prompt-cache-gb X`: snapshots of sequences' carried state after a prompt prefix,
// so a request whose prompt starts with an earlier one's ids resumes from that state and prefills
// only the rest (docs/serve.md, "Prompt cache").
//
// A snapshot (BatchEngine::Snapshot) is keyed by the exact ids fed to reach it. The KDA recurrent
// and ShortConv state summarise the whole prefix, so a snapshot serves a prompt only at exactly its
// own length: lookup() finds the longest snapshot whose ids are a proper prefix of the prompt (at
// least one id is left to feed, whose logits the request samples from). The scan compares ids with
// memcmp over every held snapshot: the budget bounds them, and the scan costs microseconds next to
// one pass over the model.
//
// The held bytes (the snapshots' state plus their ids) stay within the budget: an insert that would
// pass it first evicts the least valuable snapshots, value = positions / (1 + uses since its last
// use), so a long prefix used recently stays and a short or stale one goes first. One that alone is
// larger than the budget is not taken. Only the scheduler thread uses it.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "pipeline/run/batch_engine.hpp"

namespace k3::pipeline::serve {

class PromptCache {
 public:
  explicit PromptCache(uint64_t budget_bytes) : budget_(budget_bytes) {}

  // The snapshot of the longest held prefix of `prompt` shorter than the prompt, or null. Counts a
  // hit (and its positions) or a miss.
  const BatchEngine::Snapshot* lookup(std::span<const int32_t> prompt);
  // Whether a snapshot after `ids` holding `state_bytes` of state is worth copying: it is not held
  // already and it fits the budget on its own. When it is, the least valuable snapshots are evicted
  // until it fits beside the rest, so copying it never takes the held bytes past the budget.
  bool make_room(std::span<const int32_t> ids, uint64_t state_bytes);
  // Holds `snap` under `ids` (ids.size() == snap.positions), evicting as make_room() does. Returns
  // false (and holds nothing) when make_room() says no.
  bool insert(std::span<const int32_t> ids, BatchEngine::Snapshot snap);

  struct Stats {
    uint64_t hits = 0, misses = 0, hit_tokens = 0, inserts = 0, evictions = 0;
  };
  const Stats& stats() const { return stats_; }
  uint64_t bytes() const { return bytes_; }  // held: every snapshot's state and ids
  uint64_t budget() const { return budget_; }
  size_t size() const { return entries_.size(); }

 private:
  struct Entry {
    std::vector<int32_t> ids;
    BatchEngine::Snapshot state;
    uint64_t last_use = 0;
    uint64_t bytes() const { return state.bytes() + 4 * uint64_t(ids.size()); }
  };
  const Entry* find_exact(std::span<const int32_t> ids) const;
  void evict_one();

  uint64_t budget_ = 0, bytes_ = 0, clock_ = 0;
  std::vector<Entry> entries_;
  Stats stats_;
};

}  // namespace k3::pipeline::serve
