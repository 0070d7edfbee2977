// The canonical tensor list of the real Kimi K3 checkpoint (docs/model.md §2.1, docs/engine.md §1.3-1.4):
// every tensor's name, dtype and shape, shard by shard. One source of truth for the header-only
// (sparse) replica that `k3flow synth --sparse` writes and for the real-scale index tests. The
// decoder layers and the head are io/released_tensors.hpp's list for the real config (the list the
// engine binds by); only the shard assignment, the data order and the vision tower are added here.
//
// Shards (0-based index s; file k3_shard_file_name(s) is 1-based): s = 0..92 hold decoder layer s
// (layer 0 = KDA + dense FFN; 1..92 = KDA or MLA + MoE with 896 MXFP4 experts), s = 93 the
// embedding, lm_head, final norm and model-level AttnRes pair, s = 94..95 the vision tower.
//
// Within a shard, tensors are listed in data order: F32 first, then BF16, then U8, each group
// sorted by name (the order safetensors' writer uses). Written with layout_shard(tensors, {}) (no
// __metadata__, header space-padded to 8), shards 0..93 come out at exactly the published sizes;
// that match is what pins the small-vector dtypes, which neither reference records:
//   F32:  A_log, dt_bias, o_norm, q/k/v_conv1d (the 6 F32 of the layer-0 census, docs/model.md §2.1),
//         gate.e_score_correction_bias;
//   BF16: everything else that is not an expert (norms, *_res_proj, routed_expert_norm,
//         q_a/kv_a_layernorm, the model-level vectors);
//   U8:   experts.E.{w1,w2,w3}.{weight_packed,weight_scale}.
// The vision tower (168 tensors) is invented - its names are not published - and sized so the two
// vision shards also land on their published sizes; text engines never read it.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "io/safetensors_writer.hpp"

namespace k3::io {

constexpr uint32_t kK3Shards = 96;
constexpr uint32_t kK3Layers = 93;
constexpr uint32_t kK3Experts = 896;
constexpr uint64_t kK3Tensors = 497'220;
constexpr uint64_t kK3CheckpointBytes = 1'560'936'091'448;  // all 96 files, headers included
constexpr uint64_t kK3ExpertBytes = 17'547'264;             // one routed expert, six U8 tensors

// Zero-based layer `l` of the real model is MLA iff l+1 is in full_attn_layers = 4,8,...,92,93.
constexpr bool k3_layer_is_mla(uint32_t l) {
  return l % 4 == 3 || l == kK3Layers - 1;
}

// "model-00001-of-000096.safetensors" for shard 0 (5-digit index, 6-digit total, as published).
std::string k3_shard_file_name(uint32_t shard);

// The tensors of one shard, in data order (see above). Throws usage Error for shard >= 96.
std::vector<TensorEntry> k3_shard_tensors(uint32_t shard);

// The published byte size of each shard file (docs/engine.md §1.3).
uint64_t k3_published_shard_bytes(uint32_t shard);

// config.json of the released (nested) shape with the real values.
std::string k3_config_json();

}  // namespace k3::io
