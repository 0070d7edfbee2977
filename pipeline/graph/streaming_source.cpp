#include "pipeline/graph/streaming_source.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "io/error.hpp"
#include "io/layer_decode.hpp"
#include "io/packed_trunk.hpp"
#include "io/uring_reader.hpp"
#include "pipeline/graph/reader_options.hpp"
#include "stages/forward.hpp"
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
    out.first_offset = w.offset;
  } else {
    out.bind_offset = 0;
    for (const stages::Placement& p : g.layout.places)
      out.reads.push_back(Extent{&shards_.shard_file(p.info.shard), p.info.offset, p.offset, p.info.nbytes});
    out.first_offset = g.layout.places.empty() ? 0 : g.layout.places[0].info.offset;
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

PlanInputs plan_inputs(const io::ModelConfig& c, const io::ShardSet& shards, const io::PackedTrunk* trunk,
                       uint64_t context, int n_bound, int max_seqs, int spec) {
  const int n = n_bound <= 0 || n_bound > c.n_layers ? c.n_layers : n_bound;
  PlanInputs in;
  if (trunk) {
    const bool compressed = trunk->codec() != io::codec::Codec::none;
    for (const io::TrunkLayer& L : trunk->layers())
      in.layers.push_back(
          {.read_bytes = L.nbytes, .widen_bytes = 0, .stored_bytes = compressed ? L.stored_bytes : 0});
    in.codec = io::codec::codec_name(trunk->codec());
  } else {
    for (const io::TrunkLayer& L : io::layout_trunk(shards, c.n_layers).layers)
      in.layers.push_back({L.nbytes, 0});
  }
  in.layers.resize(size_t(n));
  for (int l = 0; l < n; ++l)
    in.layers[size_t(l)].widen_bytes =
        4 * stages::locate(stages::layer_tensors(c, l).tensors, shards, c).widen_floats;
  if (trunk && io::codec::fused_decode(trunk->codec())) {
    // The decoded slot of a fused codec: only the pages the decode stage writes (vectors, the
    // router, blocks cut by a tensor edge) are ever touched; one slot serves every layer, so the
    // union of their pages (pack-trunk writes blocks of the default size; trunk_decode checks it).
    const uint64_t block_bytes = 2 * uint64_t(io::codec::default_block_values(trunk->codec()));
    std::vector<bool> page;
    for (int l = 0; l < n; ++l) {
      const io::TrunkLayer& T = trunk->layer(l);
      const auto coded = stages::coded_ranges(c, l, packed_layer_layout(c, T, l), 0);
      page.resize(std::max<size_t>(page.size(), size_t(align_up(T.nbytes, kDirectAlign) / kDirectAlign)));
      for (uint32_t b : io::staged_blocks(coded, T.nbytes, block_bytes)) {
        const uint64_t b0 = b * block_bytes, b1 = std::min(b0 + block_bytes, T.nbytes);
        for (uint64_t q = b0 / kDirectAlign; q < (b1 + kDirectAlign - 1) / kDirectAlign; ++q)
          page[size_t(q)] = true;
      }
    }
    const auto pages = uint64_t(std::count(page.begin(), page.end(), true));
    in.fused_slot_bytes = std::max<uint64_t>(pages, 1) * kDirectAlign;
  }

  // The embedding is read a row per id where it can be (WeightSources::Head, stages::EmbedRows): the
  // head holds one row's bytes instead of the table.
  const std::optional<stages::EmbedRows> rows = stages::embed_rows_of(shards, c);
  stages::Layout head =
      stages::locate(rows ? stages::head_tensors_without_embed(c) : stages::model_tensors(c), shards, c);
  const uint64_t head_bytes = align_up(head.buffer_bytes, kDirectAlign) +
                              align_up(4 * head.widen_floats, kDirectAlign) +
                              (rows ? align_up(rows->row_bytes(), kDirectAlign) : 0);
  // KDA state for the KDA layers only (the references allocate it for every layer; MLA layers have
  // none) and the KV cache: what stages::DecodeState allocates, from the same StateSizes.
  const stages::StateSizes state = stages::StateSizes::of(c, n, context);
  const uint64_t S = uint64_t(std::max(max_seqs, 1));
  bool moe = false;
  for (int l = 0; l < n; ++l) moe = moe || (!c.is_dense(l) && c.n_experts > 0);
  const std::vector<PlanTerm> scratch = scratch_terms(c, context, int(S), moe, spec);
  in.seq_kda_bytes = state.kda_bytes();
  in.seq_kv_bytes = state.kv_bytes();
  in.context = context;
  in.max_seqs = int(S);
  in.pass_rows = pass_rows(context, int(S));
  const std::string seqs = S > 1 ? fmt::format(" x {} sequences", S) : "";
  const uint64_t index = shards.index_bytes() + (trunk ? trunk->index_bytes() : 0);
  // The two readers' rings, at the queue depths the graph opens them with (reader_options.hpp); an
  // adaptive reader's ring is sized for its deepest window.
  const io::UringReader::Options trunk_opts = trunk_reader_options();
  const uint64_t trunk_ring =
      io::UringReader::ring_bytes(std::max(trunk_opts.queue_depth, trunk_opts.max_depth));
  const io::UringReader::Options expert_opts = expert_reader_options(0, int(S));
  const uint64_t expert_ring =
      io::UringReader::ring_bytes(std::max(expert_opts.queue_depth, expert_opts.max_depth));
  in.resident = {
      {rows ? "lm_head + head vectors (embedding rows read per id)" : "embedding + lm_head + head vectors", 1,
       head_bytes, head_bytes},
      {fmt::format("KDA recurrent + conv state ({} KDA layers{})", state.n_kda, seqs),
       S * uint64_t(state.n_kda), state.kda_layer_bytes(), S * state.kda_bytes()},
      {fmt::format("MLA KV cache ({} positions{}, {} MLA layers)", context, seqs, state.n_mla), S * context,
       state.kv_position_bytes(), S * state.kv_bytes()},
  };
  in.resident.insert(in.resident.end(), scratch.begin(), scratch.end());
  in.resident.push_back(
      {trunk ? "tensor index (shards + trunk.json)" : "tensor index (shards)", 1, index, index});
  in.resident.push_back({"io_uring rings (trunk + experts)", 2, trunk_ring == expert_ring ? trunk_ring : 0,
                         trunk_ring + expert_ring});
  if (c.first_dense < c.n_layers && c.n_experts > 0) {
    in.expert_bytes = stages::locate_expert(shards, c, c.first_dense, 0).buffer_bytes;
    in.top_k = c.top_k;
    for (int l = 0; l < n; ++l)
      if (!c.is_dense(l)) in.routed_experts += uint64_t(c.n_experts);
  }
  return in;
}

}  // namespace k3::pipeline
