// The state of one decode step (forward call) in the streaming graph: its sequences, activations,
// the layer being computed and its MoE run. StreamingModel::Impl (graph_impl.hpp) owns it;
// forward_batch prepares it before a call (Impl::prepare_call), and the node bodies
// (graph_nodes.cpp) find it from their message's visit (Impl::step) and touch it only while that
// call runs.
#pragma once
#include <cstddef>
#include <span>
#include <vector>

#include "pipeline/graph/call_buffers.hpp"
#include "pipeline/graph/graph_messages.hpp"
#include "pipeline/graph/moe_layer_run.hpp"
#include "stages/bind.hpp"
#include "stages/forward.hpp"
#include "stages/layer.hpp"

namespace k3::pipeline {

// One decode step in flight: its inputs, activations, the layer being computed and its MoE run.
// A step carries one or more sequences (segments of its T rows, each with its own DecodeState);
// every row-wise node runs once over all T rows, the attention per segment, the head at each
// segment's last row. Today the driver runs one step at a time (StreamingModel::Impl::step() has
// one); several steps in flight would be a table of these keyed by step.
struct StepState {
  explicit StepState(MoeLayerRun::Waves w) : moe(w) {}
  std::vector<stages::Segment> segs;
  std::vector<stages::LayerSegment> layer_segs;  // the attention node's per-layer views of segs
  size_t T = 0;                                  // rows: every segment's together
  std::span<float> logits;                       // segs.size() x vocab (head_all: T x vocab)
  bool head_all = false;                         // the head at every row (one segment: a verify pass)
  // After layer `layer`'s output is in P: each segment's watch scans its own rows.
  void after_layer(int layer, std::span<const float> P, size_t hidden) {
    for (const stages::Segment& s : segs)
      s.state->watch.after_layer(layer, P.subspan(s.first_row * hidden, s.rows * hidden), hidden,
                                 s.state->cached);
  }
  CallBuffers buf;
  struct Current {  // the layer being computed (one at a time: each needs the previous one's output)
    int layer = -1;
    graph_detail::SlotRef slot;
    const stages::LayerWeights* w = nullptr;
  } cur;
  MoeLayerRun moe;  // the MoE layer being computed
};

}  // namespace k3::pipeline
