// The decode stage's state sized for a plan (trunk_decode_stage.hpp).
#include "pipeline/graph/trunk_decode_stage.hpp"

#include "stages/bind.hpp"

namespace k3::pipeline {

TrunkDecodeStage::TrunkDecodeStage(const MemoryPlan& plan, const WeightSources& src, int decode_slots)
    : fused(fused_codec(plan.codec)) {
  const int n_layers = src.n_layers();
  decoded_once.assign(size_t(n_layers), 0);
  slot_stream.resize(size_t(decode_slots));
  slot_ring.assign(size_t(decode_slots), -1);
  fused_ranges.resize(size_t(n_layers));
  fused_known = std::make_unique<std::atomic<bool>[]>(size_t(n_layers));
  for (int l = 0; l < n_layers && fused; ++l) {  // the coded ranges, from the layout (nothing read)
    fused_ranges[size_t(l)] =
        stages::coded_ranges(src.config(), l, src.layer(l).layout, src.layer(l).bind_offset);
    fused_known[size_t(l)].store(true);
  }
}

}  // namespace k3::pipeline
