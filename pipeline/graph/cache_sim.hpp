// `k3flow cache-sim` (docs/routing.md): replays a routing trace (routing_trace.hpp) through the
// engine's own ExpertCache -- request, landed, release, exactly as the graph's expert_fetch and
// expert_compute nodes drive it -- with no bytes behind the slots, per capacity and policy, beside
// Belady's offline optimum and the compulsory-miss ceiling. A group is one layer visit: the distinct
// experts its positions chose, requested in order and pinned until the group is done, as MoeLayerRun
// claims them, so a victim is never an expert of the layer under way; when every slot is pinned (a
// visit with more distinct experts than slots) the held wave is released and the rest follows, as
// the engine's waves do. Belady is held to the same rules.
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "pipeline/graph/cache_policy.hpp"
#include "pipeline/graph/routing_trace.hpp"

namespace k3::pipeline {

// One packed routed expert of the full-size K3 in its cache slot (docs/engine.md §3.5).
inline constexpr uint64_t kK3ExpertSlotBytes = 17'551'360;

enum class ReplayOrder { incremental, recorded };

struct ReplayGroup {
  int layer = 0;                 // the trace's layer number
  std::vector<int32_t> experts;  // distinct, in the order first chosen
};
// incremental: position by position, layer by layer (a decode, one position per visit); recorded:
// the file's own layer visits (a pass's positions together, as a prefill).
std::vector<ReplayGroup> replay_groups(const RoutingTrace&, ReplayOrder);
// Slots of `gib` GiB: floor(gib * 2^30 / slot_bytes).
uint64_t slots_for_gib(double gib, uint64_t slot_bytes);

uint64_t replay_hits(const RoutingTrace&, std::span<const ReplayGroup>, ExpertPolicy, uint64_t slots);
uint64_t belady_hits(const RoutingTrace&, std::span<const ReplayGroup>, uint64_t slots);

// A prefetch predictor judged on the trace: for each position after the first and each layer after
// the first, what it would have read ahead while the layer before ran, against what the layer used.
struct PredictorScore {
  std::string name;
  uint64_t predicted = 0, used = 0, correct = 0;
  double precision() const { return predicted ? double(correct) / double(predicted) : 0; }
  double recall() const { return used ? double(correct) / double(used) : 0; }
};
// "previous position": the experts the previous position used at the layer ahead; "previous 2
// positions": the union over the two before.
std::vector<PredictorScore> locality_predictors(const RoutingTrace&);

struct CacheSimOptions {
  std::vector<double> cache_gib;
  std::vector<ExpertPolicy> policies;
  ReplayOrder order = ReplayOrder::incremental;
  uint64_t slot_bytes = kK3ExpertSlotBytes;
};
struct CacheSimRow {
  double gib = 0;
  uint64_t slots = 0;
  std::vector<uint64_t> hits;  // per policy
  uint64_t belady = 0;
};
struct CacheSimResult {
  uint64_t requests = 0, distinct = 0, steps = 0;  // steps: positions (incremental) or passes
  std::vector<CacheSimRow> rows;
  std::vector<PredictorScore> predictors;
  double hit_ceiling() const { return requests ? double(requests - distinct) / double(requests) : 0; }
};
// Usage Error when a capacity holds fewer slots than one layer's top_k.
CacheSimResult simulate_cache(const RoutingTrace&, const CacheSimOptions&);
std::string format_cache_sim(const RoutingTrace&, const CacheSimOptions&, const CacheSimResult&,
                             const std::string& trace_name);
std::string cache_sim_json(const RoutingTrace&, const CacheSimOptions&, const CacheSimResult&);

}  // namespace k3::pipeline
