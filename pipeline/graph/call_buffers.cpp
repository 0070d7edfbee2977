#include "pipeline/graph/call_buffers.hpp"

#include <array>
#include <iterator>

#include "stages/attnres.hpp"
#include "stages/head.hpp"
#include "stages/layer.hpp"
#include "stages/moe.hpp"
#include "stages/scratch.hpp"

namespace k3::pipeline {

namespace {

struct Region {
  std::span<float> CallBuffers::*region;
  size_t floats;
};

// The one layout table: every region, in carving order, with its size in floats.
std::array<Region, 19> layout(const io::ModelConfig& c, size_t T, size_t cap, bool moe, size_t heads) {
  const size_t maxb = size_t(c.max_blocks()), E = size_t(c.hidden), L = size_t(c.latent);
  const size_t rows = T * size_t(c.top_k);
  return {{
      {&CallBuffers::P, T * E},
      {&CallBuffers::blocks, maxb * T * E},
      {&CallBuffers::x, T * E},
      {&CallBuffers::a, T * E},
      {&CallBuffers::attn_sc, stages::layer_attention_scratch(c, T, cap > T ? cap - T : 0)},
      {&CallBuffers::dense_sc, stages::dense_scratch(c, T)},
      {&CallBuffers::h, heads * E},                              // the head's input
      {&CallBuffers::head_sc, heads * E},                        // the head's scratch
      {&CallBuffers::agg_sc, stages::attnres_scratch(c, maxb)},  // model-level AttnRes
      {&CallBuffers::route_sc, moe ? stages::route_scratch(c) : 0},
      {&CallBuffers::weight, moe ? rows : 0},
      {&CallBuffers::z, moe ? T * L : 0},
      {&CallBuffers::eout, moe ? rows * L : 0},  // expert outputs, [T][top_k][latent]
      {&CallBuffers::shared, moe ? T * E : 0},
      {&CallBuffers::shared_sc, moe ? stages::shared_scratch(c, T) : 0},
      {&CallBuffers::apply_sc, moe ? stages::expert_apply_scratch(c, rows) : 0},  // per expert, disjoint
      {&CallBuffers::combine_sc, moe ? stages::combine_scratch(c, T) : 0},
      {&CallBuffers::la_route_sc, moe ? stages::route_scratch(c) : 0},  // lookahead route
      {&CallBuffers::la_weight, moe ? rows : 0},                        // lookahead weight
  }};
}

size_t total_floats(const std::array<Region, 19>& regions) {
  size_t total = 0;
  for (const Region& r : regions) total += r.floats;
  return total;
}

}  // namespace

uint64_t call_buffer_bytes(const io::ModelConfig& c, size_t T, size_t cap, bool moe, size_t heads) {
  const uint64_t index_rows = moe ? uint64_t(T) * uint64_t(c.top_k) : 0;  // idx and la_idx
  return 4 * uint64_t(total_floats(layout(c, T, cap, moe, heads))) + 2 * 4 * index_rows;
}

void CallBuffers::prepare(const io::ModelConfig& c, size_t T, size_t cap, bool moe, size_t heads) {
  const std::array<Region, 19> regions = layout(c, T, cap, moe, heads);
  const size_t total = total_floats(regions);
  if (mem.size() < total) {
    B.reset();                       // it views `mem`
    std::vector<float>().swap(mem);  // freed first: the peak is the new size, not old + new
    mem.resize(total);
  }
  stages::Carver cut(mem);
  for (const Region& r : regions) this->*r.region = cut.take(r.floats);
  const size_t rows = moe ? T * size_t(c.top_k) : 0;
  if (idx.size() < rows) {
    std::vector<int32_t>().swap(idx);
    std::vector<int32_t>().swap(la_idx);
    idx.resize(rows);
    la_idx.resize(rows);
  }
  const size_t maxb = size_t(c.max_blocks()), E = size_t(c.hidden);
  B.emplace(blocks, maxb, T, E);
}

}  // namespace k3::pipeline
