// The activations of one decode step (forward call) in the streaming graph: the hidden state, the
// block stack, and every stage's output and scratch, carved from one buffer that grows only (a
// call that feeds more tokens than any before, i.e. a full recompute), never in incremental decode.
// Each region is named once, next to its size, in one layout table (call_buffers.cpp): prepare()
// carves it and call_buffer_bytes() sums it, which is the planner's activation term (planner.cpp),
// so the plan counts exactly what a pass of its rows allocates.
#pragma once
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "io/config.hpp"
#include "stages/attnres.hpp"

namespace k3::pipeline {

struct CallBuffers {
  std::vector<float> mem;  // grows only
  std::span<float> P, blocks, x, a, attn_sc, dense_sc, h, head_sc, agg_sc;
  std::span<float> route_sc, weight, z, eout, shared, shared_sc, apply_sc, combine_sc, la_route_sc, la_weight;
  std::vector<int32_t> idx, la_idx;  // top-k choices: the router's and the lookahead's
  std::optional<stages::BlockStack> B;

  // Sizes and carves every region for T rows (every sequence's of the step) whose states hold
  // `capacity` positions each, with logits for `heads` rows (one per sequence); a dense model (moe
  // false) gets empty MoE regions. The attention scratch is sized for T rows at capacity - T cached
  // positions, which bounds any split of the T rows into sequences: a segment's MLA scratch grows
  // with its rows and its cached + new positions, both at most T and capacity.
  // Growing frees the old buffer before the new one is allocated (nothing in it outlives a call),
  // so the peak is the new size, never old + new.
  void prepare(const io::ModelConfig& c, size_t T, size_t capacity, bool moe, size_t heads = 1);
  // Bytes held now: the float buffer and the two top-k index vectors.
  uint64_t bytes() const { return 4 * uint64_t(mem.size()) + 4 * uint64_t(idx.size() + la_idx.size()); }
};

// The bytes prepare() holds for these arguments (its layout table summed, plus the index vectors):
// what the planner counts for a pass of T rows.
uint64_t call_buffer_bytes(const io::ModelConfig& c, size_t T, size_t capacity, bool moe, size_t heads = 1);

}  // namespace k3::pipeline
