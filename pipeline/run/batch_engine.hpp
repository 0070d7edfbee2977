// Several sequences decoded by one engine, a step at a time: what `k3flow serve` drives.
//
// The engine holds the model (resident, or streamed through the flow graph within a budget) and
// one carried state (KDA recurrent + conv state, MLA KV cache) per sequence slot, `max_seqs` of
// them, allocated up front so the budget covers them all. A step feeds each of its rows -- a slot
// and the ids that slot has pending (a whole prompt, or the one id sampled last step) -- and writes
// each row's last-position logits. Sequences join and leave at step boundaries: a slot is reset
// before a new sequence uses it, and a row only names the slots that have something to feed.
//
// A step is ONE pass over the model for all its rows (stages::forward_batch resident,
// StreamingModel::forward_batch streamed): every trunk layer is read once per step whatever the
// number of sequences, and a layer's routed experts are the union of the step's tokens' choices.
// A pass carries at most max_step_rows() ids (what the activations and the plan are sized for);
// a step with more -- a long prompt joining -- is split into passes, each taking the rows with
// the fewest ids first (the decoding sequences' single ids) and as much of the prompts as fits
// (chunked prefill: a prompt fed in pieces gives the bits it gives fed whole).
//
// Exactness: each row's logits are bit-identical to feeding that sequence alone (Decoder), whatever
// other rows share the step -- the engine's row-wise arithmetic never depends on how many rows a
// pass carries (kernels::matmul is bit-identical to matvec per row), and each sequence's attention
// reads and writes only its own state.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "io/config.hpp"
#include "io/safetensors.hpp"
#include "pipeline/run/decoder.hpp"
#include "pipeline/run/streaming_run.hpp"
#include "stages/bind.hpp"
#include "stages/forward.hpp"
#include "stages/scratch.hpp"

namespace k3::pipeline {

class BatchEngine {
 public:
  // One row of a step: slot `seq` feeds `ids` at its next positions; `logits` (vocab floats)
  // receives the logits of the last of them.
  struct Row {
    int seq = 0;
    std::span<const int32_t> ids;
    std::span<float> logits;
  };

  // Opens the model as Decoder does (o.capacity: the positions each sequence may hold; --context
  // replaces it) with `max_seqs` state slots. Prints what it loads to stdout. Throws usage Error
  // (exit 2) for max_seqs < 1 and as Decoder does for its flags.
  BatchEngine(const DecoderOptions& o, io::ModelConfig cfg, int max_seqs);
  ~BatchEngine();
  BatchEngine(const BatchEngine&) = delete;
  BatchEngine& operator=(const BatchEngine&) = delete;

  const io::ModelConfig& config() const { return cfg_; }
  int max_seqs() const { return int(states_.size()); }
  size_t capacity() const { return capacity_; }  // positions per sequence
  size_t cached(int seq) const;                  // positions slot `seq` has fed
  StreamRun* stream() { return stream_.get(); }  // null when resident
  uint64_t state_bytes() const;                  // every slot's carried state
  // Ids one pass carries at most: max(capacity(), max_seqs()). A step feeding more is split.
  size_t max_step_rows() const { return max_rows_; }
  // Lowers the cap (1..the default): smaller passes, for a server that bounds a step's latency, and
  // for tests of the split. Throws usage Error outside that range.
  void set_max_step_rows(size_t n);
  int passes_last_step() const { return passes_; }  // passes the last step() took (1 unless split)

  void reset(int seq);  // forget slot `seq`'s sequence: zero its state

  // Feeds every row. Rows name distinct slots in [0, max_seqs). Before anything is computed the
  // rows are checked (ids in the vocabulary, room in each slot's KV cache, distinct slots): a bad
  // row throws io::Error naming its slot and no state changes. Non-finite logits in a row throw
  // run_invalid (exit 4) naming the slot and the layer, after the step (the other rows' states
  // have advanced; the failing slot must be reset).
  void step(std::span<const Row> rows);

 private:
  io::ModelConfig cfg_;
  int n_layers_;
  size_t capacity_;
  io::ShardSet shards_;
  std::unique_ptr<StreamRun> stream_;
  std::unique_ptr<stages::ResidentModel> model_;
  std::vector<std::unique_ptr<stages::DecodeState>> states_;
  stages::Scratch scratch_;
  size_t max_rows_ = 0;
  int passes_ = 0;
  std::vector<float> pass_logits_;
  std::vector<int32_t> pass_ids_;
};

}  // namespace k3::pipeline
