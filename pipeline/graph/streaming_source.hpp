// Where the streamed bytes come from and how they are bound once they land (docs/design.md §3,
// docs/engine.md §2, §3.4). Built once at start from headers only; the graph asks it for the reads that
// fill a slot and for the Layout that binds the slot's bytes.
//
// Trunk layer l, in order of preference:
//   --trunk DIR          one read of trunk.json's [file_off, file_off + nbytes) of trunk.bin into a
//                        4096-aligned slot: a single O_DIRECT read (the reason pack-trunk exists);
//                        a compressed trunk: [file_off, file_off + stored_bytes) into a ring slot,
//                        decoded by the graph's decode stage into a decoded slot (graph.hpp);
//   contiguous shard run the layer's tensors tile one range of one shard: one read of the enclosing
//                        4096-aligned window (clipped at end of file), the layout bound at the run's
//                        offset inside the window, so the interior is O_DIRECT and F32 / BF16 tensors
//                        keep the file's alignment modulo 8;
//   scattered tensors    one read per tensor to 64-aligned offsets (as stages::locate lays them out).
// Routed expert (l, e): its six MXFP4 tensors (or three dense ones) as one contiguous run, read as
// its enclosing 4096 window into an expert slot; experts whose tensors are not one run are read
// tensor by tensor. Only a compact record per expert is kept (16 bytes; 82,432 experts for K3):
// the bind Layout is shared by every expert with the same geometry (relative offsets, dtypes,
// alignment), which for a released or synthetic checkpoint is one per model.
//
// plan_inputs() gives the planner these exact slot sizes, so the plan's pools are what the graph
// allocates.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "io/aligned.hpp"
#include "io/config.hpp"
#include "io/file.hpp"
#include "io/safetensors.hpp"
#include "pipeline/graph/planner.hpp"
#include "stages/bind.hpp"
#include "stages/head.hpp"

namespace k3::io {
class PackedTrunk;
struct TrunkLayer;
}  // namespace k3::io

namespace k3::pipeline {

// The planner's inputs from a checkpoint: layer footprints from the packed trunk when given, else as
// pack-trunk would lay the layers out from the shard index; resident terms for `context` positions. The first
// `n_bound` layers are planned (<= 0: all); the KDA state and MLA KV cache terms are
// stages::StateSizes, the very sizes stages::DecodeState allocates, `max_seqs` times (a batched
// run holds that many sequences' states: pipeline::BatchEngine). The activation terms
// (scratch_terms) are for a pass of pass_rows(context, max_seqs) rows -- the engine (Decoder,
// BatchEngine) splits anything longer into passes of at most that many -- and, with `spec` > 0, a
// verify pass of 1 + spec rows.
PlanInputs plan_inputs(const io::ModelConfig& config, const io::ShardSet& shards,
                       const io::PackedTrunk* trunk, uint64_t context, int n_bound = 0, int max_seqs = 1,
                       int spec = 0);

// One positioned read into a slot: `bytes` at `offset` of `file` to slot byte `dst_offset`.
struct Extent {
  const io::File* file = nullptr;
  uint64_t offset = 0;
  uint64_t dst_offset = 0;
  uint64_t bytes = 0;
};

struct LayerSource {
  stages::Layout layout;     // binds slot bytes [bind_offset, bind_offset + layout.buffer_bytes)
  uint64_t bind_offset = 0;  // where the layout's buffer starts inside the slot
  uint64_t slot_bytes = 0;   // slot bytes this layer needs (a 4096-multiple)
  uint64_t read_bytes = 0;   // sum of the extents
  std::vector<Extent> reads;
  // A compressed trunk's layer: `reads` fetch its stored bytes (this many, a 4096-multiple) into a
  // ring slot, and the decode stage decodes them into slot_bytes of a decoded slot; 0 when raw.
  uint64_t stored_bytes = 0;
};

// A packed trunk layer's layout: its tensors at their offsets in the layer image (bind offset 0).
stages::Layout packed_layer_layout(const io::ModelConfig&, const io::TrunkLayer&, int layer);

// A routed expert's read, resolved on demand (nothing per expert is kept but a 16-byte record).
struct ExpertRead {
  std::vector<Extent> reads;  // usually one window; one per tensor for a scattered expert
  uint64_t read_bytes = 0;
  uint64_t bind_offset = 0;
  const stages::Layout* layout = nullptr;  // shared by the experts of a layer with equal geometry
  uint64_t first_offset = 0;               // where its first read starts (trace events show it)
};

class WeightSources {
 public:
  // Locates every bound layer's trunk and every routed expert (refusing missing / mis-sized tensors
  // by name, before anything is read). `trunk` may be null (read from the shards).
  static std::unique_ptr<WeightSources> open(const io::ModelConfig&, const io::ShardSet&,
                                             const io::PackedTrunk* trunk, int n_layers);

  const io::ModelConfig& config() const { return cfg_; }
  int n_layers() const { return static_cast<int>(layers_.size()); }
  bool from_trunk() const { return from_trunk_; }
  const io::PackedTrunk* trunk() const { return trunk_; }  // null when reading the shards
  const LayerSource& layer(int l) const { return layers_.at(static_cast<size_t>(l)); }

  bool has_experts() const { return !expert_index_.empty(); }
  // Fills `out` (reusing its capacity) with expert (l, e)'s reads into a slot.
  void expert(int l, int e, ExpertRead& out) const;
  uint64_t expert_window_bytes() const { return expert_window_; }  // read part of an expert slot
  uint64_t expert_widen_floats() const { return expert_widen_; }   // widen part (0 for MXFP4)

  // The head (final norm, output AttnRes, lm_head), read and bound into owned memory; the embedding
  // stays in the checkpoint and is read a row per id (`rows`, stages::EmbedRows) unless its dtype
  // needs widening at bind (then it is bound with the rest, w.embed).
  struct Head {
    io::AlignedBuffer bytes;
    std::vector<float> widen;
    stages::HeadWeights w;
    std::optional<stages::EmbedRows> rows;
    std::vector<std::byte> row;  // one row's bytes, for rows
    // out[t] = the embedding of ids[t], as stages::embed_tokens gives it.
    void embed(const io::ModelConfig&, std::span<const int32_t> ids, std::span<float> out);
  };
  std::unique_ptr<Head> load_head() const;

  // The planner's inputs with this source's exact slot sizes (layers, expert slot) plus the resident
  // terms of pipeline::plan_inputs and `extra_resident` (e.g. the process's own baseline).
  PlanInputs plan_inputs(uint64_t context, std::vector<PlanTerm> extra_resident, int max_seqs = 1,
                         int spec = 0) const;

 private:
  WeightSources(const io::ModelConfig& c, const io::ShardSet& s, const io::PackedTrunk* t)
      : cfg_(c), shards_(s), trunk_(t) {}
  struct ExpertRec {
    uint64_t run_begin;
    uint32_t shard;
    uint16_t geometry;  // index into geometries_
    uint16_t pad = 0;
  };
  struct Geometry {
    stages::Layout layout;  // contiguous: offsets from the run start; scattered: 64-aligned packing
    bool contiguous = true;
  };

  io::ModelConfig cfg_;
  const io::ShardSet& shards_;
  const io::PackedTrunk* trunk_;
  bool from_trunk_ = false;
  std::vector<LayerSource> layers_;
  std::vector<std::vector<ExpertRec>> expert_index_;  // [layer][expert]; empty rows for dense layers
  std::vector<Geometry> geometries_;
  uint64_t expert_window_ = 0, expert_widen_ = 0;
};

}  // namespace k3::pipeline
