#include "pipeline/graph/streaming_source.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "io/error.hpp"
#include "io/packed_trunk.hpp"
#include "stages/tensors.hpp"

namespace k3::pipeline {

namespace {

using io::align_down;
using io::align_up;
using io::kDirectAlign;

// The enclosing 4096 window of [begin, end) in a file of `size` bytes (never past its end).
Extent window(const io::File& f, uint64_t begin, uint64_t end) {
  const uint64_t w0 = align_down(begin, kDirectAlign);
  const uint64_t w1 = std::min<uint64_t>(align_up(end, kDirectAlign), std::max<uint64_t>(f.size(), end));
  return Extent{&f, w0, 0, w1 - w0};
}

bool same_geometry(const stages::Layout& a, const stages::Layout& b) {
  if (a.contiguous != b.contiguous || !a.contiguous || a.base_mod8 != b.base_mod8 ||
      a.buffer_bytes != b.buffer_bytes || a.widen_floats != b.widen_floats ||
      a.specs.size() != b.specs.size())
    return false;
  for (size_t i = 0; i < a.specs.size(); ++i) {
    const io::TensorInfo &x = a.places[i].info, &y = b.places[i].info;
    if (a.specs[i].field != b.specs[i].field || a.places[i].offset != b.places[i].offset ||
        x.dtype != y.dtype || x.nbytes != y.nbytes || x.rank != y.rank || x.shape != y.shape)
      return false;
  }
  return true;
}

}  // namespace

stages::Layout packed_layer_layout(const io::ModelConfig& c, const io::TrunkLayer& T, int l) {
  const stages::PlacementLookup lookup = [&T](const std::string& name) -> std::optional<stages::Placement> {
    const io::TrunkTensor* t = T.find(name);
    if (!t) return std::nullopt;
    io::TensorInfo info{t->dtype, t->rank, t->shape, 0, 0, t->nbytes};
    return stages::Placement{info, t->off};
  };
  return stages::place(stages::layer_tensors(c, l).tensors, lookup, c, T.nbytes, 0);
}

std::unique_ptr<WeightSources> WeightSources::open(const io::ModelConfig& c, const io::ShardSet& shards,
                                                   const io::PackedTrunk* trunk, int n_layers) {
  auto ws = std::unique_ptr<WeightSources>(new WeightSources(c, shards, trunk));
  ws->from_trunk_ = trunk != nullptr;
  if (trunk) trunk->check_source(shards);  // refuses a trunk packed from another checkpoint
  const int n = (n_layers <= 0 || n_layers >= c.n_layers) ? c.n_layers : n_layers;
  ws->layers_.resize(static_cast<size_t>(n));
  for (int l = 0; l < n; ++l) {
    LayerSource& L = ws->layers_[static_cast<size_t>(l)];
    std::vector<stages::TensorSpec> specs = stages::layer_tensors(c, l).tensors;
    if (trunk) {
      const io::TrunkLayer& T = trunk->layer(l);
      L.layout = packed_layer_layout(c, T, l);
      const bool compressed = trunk->codec() != io::codec::Codec::none;
      L.stored_bytes = compressed ? T.stored_bytes : 0;
      L.reads.push_back(Extent{&trunk->file(), T.file_off, 0, compressed ? T.stored_bytes : T.nbytes});
      L.slot_bytes = align_up(T.nbytes, kDirectAlign);
    } else {
      L.layout = stages::locate(std::move(specs), shards, c);
      const stages::Layout& lay = L.layout;
      if (lay.contiguous) {
        Extent w = window(shards.shard_file(lay.shard), lay.run_begin, lay.run_end);
        L.bind_offset = lay.run_begin - w.offset;
        L.reads.push_back(w);
        L.slot_bytes = align_up(w.bytes, kDirectAlign);
      } else {
        for (const stages::Placement& p : lay.places)
          L.reads.push_back(Extent{&shards.shard_file(p.info.shard), p.info.offset, p.offset, p.info.nbytes});
        L.slot_bytes = align_up(lay.buffer_bytes, kDirectAlign);
      }
    }
    for (const Extent& e : L.reads) L.read_bytes += e.bytes;
  }

  // Experts: one record each; layouts shared by geometry.
  ws->expert_index_.resize(static_cast<size_t>(n));
  bool any = false;
  for (int l = 0; l < n; ++l) {
    if (c.is_dense(l) || c.n_experts <= 0) continue;
    any = true;
    auto& row = ws->expert_index_[static_cast<size_t>(l)];
    row.resize(static_cast<size_t>(c.n_experts));
    for (int e = 0; e < c.n_experts; ++e) {
      stages::Layout lay = stages::locate_expert(shards, c, l, e);
      ExpertRec& r = row[static_cast<size_t>(e)];
      uint64_t need = 0;
      if (lay.contiguous) {
        r.run_begin = lay.run_begin;
        r.shard = lay.shard;
        need = window(shards.shard_file(lay.shard), lay.run_begin, lay.run_end).bytes;
      } else {
        r.run_begin = 0;
        r.shard = 0;
        need = lay.buffer_bytes;
      }
      ws->expert_window_ = std::max(ws->expert_window_, align_up(need, kDirectAlign));
      ws->expert_widen_ = std::max<uint64_t>(ws->expert_widen_, lay.widen_floats);
      size_t g = 0;
      if (lay.contiguous)
        while (g < ws->geometries_.size() && !same_geometry(ws->geometries_[g].layout, lay)) ++g;
      else
        g = ws->geometries_.size();
      if (g == ws->geometries_.size()) {
        if (g >= 0xffff)
          throw io::runtime_error(fmt::format(
              "experts: more than 65535 distinct expert layouts (layer {} expert {}); repack the checkpoint",
              l, e));
        const bool contiguous = lay.contiguous;
        ws->geometries_.push_back(Geometry{std::move(lay), contiguous});
      }
      r.geometry = static_cast<uint16_t>(g);
    }
  }
  if (!any) ws->expert_index_.clear();
  return ws;
}

void WeightSources::expert(int l, int e, ExpertRead& out) const {
  const ExpertRec& r = expert_index_.at(static_cast<size_t>(l)).at(static_cast<size_t>(e));
  const Geometry& g = geometries_[r.geometry];
  out.reads.clear();
  out.layout = &g.layout;
  if (g.contiguous) {
    const io::File& f = shards_.shard_file(r.shard);
    Extent w = window(f, r.run_begin, r.run_begin + g.layout.buffer_bytes);
    out.bind_offset = r.run_begin - w.offset;
    out.reads.push_back(w);
    out.sort_shard = r.shard;
    out.sort_offset = w.offset;
  } else {
    out.bind_offset = 0;
    for (const stages::Placement& p : g.layout.places)
      out.reads.push_back(Extent{&shards_.shard_file(p.info.shard), p.info.offset, p.offset, p.info.nbytes});
    out.sort_shard = g.layout.places.empty() ? 0 : g.layout.places[0].info.shard;
    out.sort_offset = g.layout.places.empty() ? 0 : g.layout.places[0].info.offset;
  }
  out.read_bytes = 0;
  for (const Extent& x : out.reads) out.read_bytes += x.bytes;
}

std::unique_ptr<WeightSources::Head> WeightSources::load_head() const {
  auto h = std::make_unique<Head>();
  h->rows = stages::embed_rows_of(shards_, cfg_);
  if (h->rows) h->row.resize(h->rows->row_bytes());
  const stages::Layout lay = stages::locate(
      h->rows ? stages::head_tensors_without_embed(cfg_) : stages::model_tensors(cfg_), shards_, cfg_);
  h->bytes = io::AlignedBuffer(lay.buffer_bytes + lay.base_mod8 + 1);
  std::span<std::byte> dst = h->bytes.bytes().subspan(lay.base_mod8, lay.buffer_bytes);
  stages::read_layout(lay, shards_, dst);
  h->widen.assign(lay.widen_floats, 0.0f);
  h->w = stages::bind_head(cfg_, lay, dst, h->widen);
  return h;
}

void WeightSources::Head::embed(const io::ModelConfig& c, std::span<const int32_t> ids,
                                std::span<float> out) {
  if (rows)
    stages::embed_rows(*rows, ids, out, row);
  else
    stages::embed_tokens(w, c, ids, out);
}

PlanInputs WeightSources::plan_inputs(uint64_t context, std::vector<PlanTerm> extra, int max_seqs,
                                      int spec) const {
  PlanInputs in = pipeline::plan_inputs(cfg_, shards_, trunk_, context, int(layers_.size()), max_seqs, spec);
  for (size_t l = 0; l < layers_.size(); ++l)
    in.layers[l] = {.read_bytes = layers_[l].slot_bytes,
                    .widen_bytes = 4 * layers_[l].layout.widen_floats,
                    .stored_bytes = layers_[l].stored_bytes};
  if (has_experts()) {
    // The planner's slot is align_up(expert_bytes, 4096) + 4096 (room for the enclosing window);
    // a widen area for dense experts rides on top.
    in.expert_bytes =
        std::max<uint64_t>(1, expert_window_ - kDirectAlign + align_up(4 * expert_widen_, kDirectAlign));
    in.top_k = cfg_.top_k;
  } else {
    in.expert_bytes = 0;
    in.top_k = 0;
    in.routed_experts = 0;
  }
  for (PlanTerm& t : extra) in.resident.push_back(std::move(t));
  return in;
}

}  // namespace k3::pipeline
