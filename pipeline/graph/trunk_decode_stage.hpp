// The state of the compressed trunk's decode stage (pack-trunk --codec; docs/codec.md "The decode
// stage"), part of StreamingModel::Impl (graph_impl.hpp). Who touches what: trunk_read numbers its
// reads (read_seq); trunk_decode decodes a stored layer into a decoded slot (decoded_once, scratch,
// and under fused decode slot_stream and slot_ring); trunk_bind binds a fused layer's projections
// coded (slot_stream, fused_ranges, fused_known); layer_done gives the decoded slot and its ring
// slot(s) back (slot_ring, slots_in_use); the trace counters read slots_in_use. Each of those nodes
// is serial, and a decoded slot passes from one to the next in the graph's messages. Sized once, at
// construction; a raw trunk has no decoded slots and leaves the rest unused.
#pragma once
#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "io/codec/codec.hpp"
#include "io/layer_decode.hpp"
#include "pipeline/graph/planner.hpp"
#include "pipeline/graph/streaming_source.hpp"

namespace k3::pipeline {

struct TrunkDecodeStage {
  // `decode_slots`: the plan's decoded slots (TrunkSlots::decode_slots()). Under fused decode the
  // coded byte ranges of every layer come from its layout here (nothing is read).
  TrunkDecodeStage(const MemoryPlan& plan, const WeightSources& src, int decode_slots);

  // Trunk reads submitted, in trunk_read's (serial) order: each read's TrunkReady::seq, by which
  // the stored_order sequencer hands stored layers to the decode stage in read order.
  uint64_t read_seq = 0;
  std::atomic<int> slots_in_use{0};  // decoded slots holding a layer
  // Per layer: decoded once in this process (its block checks verified; later decodes skip them).
  std::vector<char> decoded_once;
  io::LayerDecodeScratch scratch;  // trunk_decode's, reused

  // Fused decode (exp4 / exp3, streamed layers; docs/codec.md "Fused decode"): the layer's
  // projections are bound coded over its stored bytes, which stay in the ring slot until
  // layer_done, and the matvecs decode them tile by tile; the decode stage decodes only the rest.
  // Per decoded slot: the parsed stream its coded matrices decode from, and the first ring slot it
  // holds (-1: none). Per layer: the byte ranges bound coded (`fused_known` then set).
  const bool fused;
  std::vector<std::optional<io::codec::Stream>> slot_stream;
  std::vector<int> slot_ring;
  std::vector<io::ByteRanges> fused_ranges;
  std::unique_ptr<std::atomic<bool>[]> fused_known;
};

}  // namespace k3::pipeline
