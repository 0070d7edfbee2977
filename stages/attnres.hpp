// Attention residuals over blocks (docs/model.md §3.3-3.4): the per-token block stack and the
// aggregator stage that mixes it with the running prefix sum.
#pragma once
#include <cstddef>
#include <span>

#include "io/config.hpp"
#include "stages/bind.hpp"

namespace k3::stages {

// Snapshots of the prefix sum at block boundaries, per token: [capacity][T][hidden], oldest
// first. Cleared at the start of every forward call (it is per token, never carried).
class BlockStack {
 public:
  BlockStack(std::span<float> storage, size_t capacity, size_t T, size_t hidden);
  size_t size() const { return n_; }
  void clear() { n_ = 0; }
  void push(std::span<const float> prefix);  // copies [T][hidden]; throws past capacity
  std::span<const float> block(size_t b, size_t t) const { return data_.subspan((b * T_ + t) * E_, E_); }
  // Replaces block b's rows (fixture tests start from a given stack).
  std::span<float> mutable_block(size_t b) { return data_.subspan(b * T_ * E_, T_ * E_); }
  void set_size(size_t n) { n_ = n; }

 private:
  std::span<float> data_;
  size_t cap_, T_, E_, n_ = 0;
};

size_t attnres_scratch(const io::ModelConfig&, size_t n_blocks);

// out[t - t_begin] = AttnRes(blocks[0..n)[t] ++ [prefix[t]]) for t in [t_begin, t_end); sources
// oldest block first, the prefix last; keys RMS-normed (gain folded into norm*proj), values raw.
void attnres_stage(const BlockStack&, std::span<const float> prefix, Vec norm, Vec proj,
                   const io::ModelConfig&, size_t t_begin, size_t t_end, std::span<float> out,
                   std::span<float> scratch);

}  // namespace k3::stages
