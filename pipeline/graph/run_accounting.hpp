// What a streamed run counts and traces, part of StreamingModel::Impl (graph_impl.hpp): busy time
// and bytes (Activity), the last forward call's StepStats, the expert counters, slots in use, the
// pinned trunk loaded so far, every node's statistics, and the trace rows. Node bodies and read
// completions add to it from any thread (atomics, or Activity's own mutex); the driver reads it
// between calls (last_step, StreamingModel::totals). Nothing here decides what the graph does.
#pragma once
#include <atomic>
#include <cstdint>
#include <memory>

#include "pipeline/graph/activity.hpp"
#include "pipeline/graph/graph_dot.hpp"
#include "pipeline/graph/graph_messages.hpp"
#include "pipeline/graph/moe_layer_run.hpp"
#include "pipeline/graph/trace.hpp"

namespace k3::pipeline {

struct RunAccounting {
  Activity activity;
  StepStats last_step;  // the last forward call's
  ExpertCounters counts;
  std::atomic<uint64_t> read_ids{0};  // the trace's async read ids, trunk and experts
  std::atomic<int> ring_in_use{0};    // trunk ring slots holding a read (the trace's counter)
  // Pinned trunk bytes loaded so far of their total, for the first step's progress bar.
  std::atomic<uint64_t> pin_loaded_bytes{0};
  uint64_t pin_total_bytes = 0;
  // Per node (indexed by Node): its statistics, in the DOT description when there is one (build()
  // points stats there), else in own_stats.
  std::unique_ptr<NodeStats[]> own_stats = std::make_unique<NodeStats[]>(graph_detail::kNodeCount);
  NodeStats* stats[graph_detail::kNodeCount] = {};
  // Trace rows: one per node (lanes where its runs overlap), one per reader for its reads.
  std::unique_ptr<TraceTrack> tracks[graph_detail::kNodeCount];
  TraceTrack embed_track{"node: embed"}, trunk_track{"reader: trunk"}, expert_track{"reader: experts"};
};

}  // namespace k3::pipeline
