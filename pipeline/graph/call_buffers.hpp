// The activations of one decode step (forward call) in the streaming graph: the hidden state, the
// block stack, and every stage's output and scratch, carved from one buffer that grows only (a
// call that feeds more tokens than any before, i.e. a full recompute), never in incremental decode.
// Each region is named once, next to its size, in prepare()'s layout table.
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
  void prepare(const io::ModelConfig& c, size_t T, size_t capacity, bool moe, size_t heads = 1);
};

}  // namespace k3::pipeline
