#include "pipeline/graph/reader_options.hpp"

#include <algorithm>
#include <optional>

#include "io/aligned.hpp"
#include "io/env.hpp"

namespace k3::pipeline {

std::shared_ptr<io::UrgentGate> urgent_gate() {
  static const std::shared_ptr<io::UrgentGate> gate = std::make_shared<io::UrgentGate>();
  return gate;
}

// Trunk reads start from a short window (4 x 1 MiB): the device serves requests about in order, so an
// expert read submitted behind 32 x 8 MiB of trunk chunks waited for all of them -- 13 ms per MoE
// layer with the compute idle (16-layer synthetic checkpoint streaming 3 layers, 1.05 GiB: overlap
// 0.079 -> 0.055-0.064 s/token). But a fixed shallow window tuned on a 2.5 GB/s disk cannot drive a
// fast one (issue 13: 5-6 GB/s devices read at 0.75 of their ceiling). So the window adapts: while the
// trunk reader is saturated it doubles its depth as long as that buys > 5 % (up to 64 x 1 MiB, the C
// reference's 64 MB in flight), and settles at the smallest depth that had the best rate
// (io::DepthTuner). While an urgent expert read is out (the layer waits for it) the trunk keeps at
// most the old 4 chunks in flight, so the expert does not queue behind the deep window. The chunks
// land in the trunk's own ring slot or pin region: a deeper window takes no memory outside the budget.
io::UringReader::Options trunk_reader_options() {
  io::UringReader::Options o;
  o.queue_depth = 4;
  o.max_depth = 64;
  o.chunk_bytes = size_t{1} << 20;
  o.gated_depth = 4;
  if (int qd = io::env::integer_or_zero(io::env::kTrunkQd)) o.queue_depth = unsigned(qd);
  if (int kb = io::env::integer_or_zero(io::env::kTrunkChunkKb)) o.chunk_bytes = size_t(kb) << 10;
  if (auto m = io::env::integer(io::env::kTrunkMaxQd)) o.max_depth = unsigned(std::max(0, *m));
  if (auto g = io::env::integer(io::env::kTrunkGatedQd)) o.gated_depth = unsigned(std::max(0, *g));
  o.gate = urgent_gate();
  return o;
}

// Expert reads complete in order, about one expert in flight at a time: with a batch of 8 experts
// all in flight at once they shared the device and landed together at the end, so "compute each
// expert as it lands" computed nothing early (medium synthetic checkpoint at 1 GiB, overlap: 0.069 ->
// 0.060 s/token). Four chunks of a quarter expert each keep the device queue non-empty. A batched
// step is different: its B rows route ~B experts a layer, all wanted at once, and one expert in
// flight at a time left a B = 8 step of `wide` waiting on its 45 MiB of experts a step; 16 chunks
// made that step 4-5 % shorter on a 7 GB/s device, while 16 at B = 1 made B = 1 ~3 % slower
// (docs/performance.md, "A batch of rows"). So a reader for max_seqs > 1 is adaptive between 4 and
// 4 per sequence (up to 16): it deepens only while queued experts keep it saturated and the deeper
// window reads faster (io::DepthTuner), so a server's one active sequence keeps 4. Its epochs are
// short (16 MiB: a B = 8 step of `wide` reads 45 MiB of experts) so it adapts within a few steps.
// Urgent (demand) reads raise the gate the trunk reader yields to.
io::UringReader::Options expert_reader_options(uint64_t expert_bytes, int max_seqs) {
  io::UringReader::Options o;
  o.queue_depth = 4;
  if (const unsigned deepest = 4 * unsigned(std::clamp(max_seqs, 1, 4)); deepest > o.queue_depth) {
    o.max_depth = deepest;
    o.epoch_bytes = uint64_t{16} << 20;
  }
  o.chunk_bytes = std::clamp<size_t>(io::align_up(expert_bytes / 4, io::kDirectAlign), size_t{256} << 10,
                                     size_t{8} << 20);
  if (int qd = io::env::integer_or_zero(io::env::kExpertQd)) {
    o.queue_depth = unsigned(qd);  // a fixed depth
    o.max_depth = 0;
  }
  if (int kb = io::env::integer_or_zero(io::env::kExpertChunkKb)) o.chunk_bytes = size_t(kb) << 10;
  o.gate = urgent_gate();
  o.raises_gate = true;
  return o;
}

}  // namespace k3::pipeline
