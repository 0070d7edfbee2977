// The full-scale replica of the released checkpoint: io/k3_names is the one list of its tensors,
// shard by shard in data order; synth only writes their headers.
#include "io/k3_names.hpp"
#include "io/synth/synth.hpp"

namespace k3::io::synth {

SynthCheckpoint layout_sparse() {
  SynthCheckpoint plan;
  plan.config = real_dims();
  plan.config_text = io::k3_config_json();
  plan.sparse = true;
  plan.shards.resize(io::kK3Shards);
  for (uint32_t s = 0; s < io::kK3Shards; ++s) {
    SynthShard& shard = plan.shards[s];
    shard.file = io::k3_shard_file_name(s);
    std::vector<io::TensorEntry> entries = io::k3_shard_tensors(s);
    shard.tensors.reserve(entries.size());
    for (io::TensorEntry& e : entries) shard.tensors.push_back(SynthTensor{std::move(e)});
  }
  return plan;
}

}  // namespace k3::io::synth
