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
// A pass carries at most max_step_rows() ids (what the activations and the plan are sized for: the
// plan's pass_rows, max(min(context, 64), max_seqs));
// a step with more -- a long prompt joining -- is split into passes, each taking the rows with
// the fewest ids first (the decoding sequences' single ids) and as much of the prompts as fits
// (chunked prefill: a prompt fed in pieces gives the bits it gives fed whole).
//
// How a joining prompt shares steps with the decoding sequences is the caller's choice, made with
// plan_step() under the engine's PrefillPolicy: inline (the prompt rides in the decode step, beside
// the others' single ids) or separate (a step of prompts only; the decoding sequences skip it), and
// optionally at most `chunk` prompt ids per step (the rest in later steps). docs/serve.md, "Prefill",
// has the measured trade-off.
//
// Exactness: each row's logits are bit-identical to feeding that sequence alone (Decoder), whatever
// other rows share the step -- the engine's row-wise arithmetic never depends on how many rows a
// pass carries (kernels::matmul is bit-identical to matvec per row), and each sequence's attention
// reads and writes only its own state.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "io/config.hpp"
#include "io/safetensors.hpp"
#include "pipeline/run/decoder.hpp"
#include "pipeline/run/streaming_run.hpp"
#include "stages/bind.hpp"
#include "stages/forward.hpp"
#include "stages/scratch.hpp"

namespace k3::pipeline {

// How a joining prompt is fed (serve / bench --prefill, --prefill-chunk).
struct PrefillPolicy {
  enum class Mode {
    inline_decode,  // in the decode step, beside the decoding sequences' ids ("inline")
    separate,       // in a step of its own: the decoding sequences skip it ("separate")
  };
  Mode mode = Mode::inline_decode;
  size_t chunk = 0;  // prompt ids a sequence feeds per step at most; 0: the whole prompt at once
};
// "inline" / "separate"; usage Error naming `flag` for anything else.
PrefillPolicy::Mode parse_prefill_mode(const std::string& text, const char* flag);
const char* prefill_mode_name(PrefillPolicy::Mode);

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
  // (exit 2) for max_seqs < 1 and as Decoder does for its flags. o.experts / o.ranks: one rank of
  // several (expert parallel, docs/distributed.md §6), holding and computing only its experts; every
  // rank must then run the same steps (serve: pipeline/serve/rank_steps.hpp).
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
  // Ids one pass carries at most: the plan's pass_rows, max(min(capacity(), 64), max_seqs()) -- what
  // its activation terms are sized for. A step feeding more is split into passes.
  size_t max_step_rows() const { return max_rows_; }
  // Lowers the cap (1..the default): smaller passes, for a server that bounds a step's latency, and
  // for tests of the split. Throws usage Error outside that range.
  void set_max_step_rows(size_t n);
  int passes_last_step() const { return passes_; }  // passes the last step() took (1 unless split)

  void reset(int seq);  // forget slot `seq`'s sequence: zero its state

  // A copy of one slot's carried state after its first `positions` ids: the KDA recurrent + conv
  // state of every KDA layer and the MLA KV + rope rows of those positions. The KDA state summarises
  // the whole prefix, so a snapshot resumes a sequence at exactly its own length, never a shorter one.
  struct Snapshot {
    size_t positions = 0;
    std::vector<float> kda, kv, rope;
    uint64_t bytes() const { return 4 * uint64_t(kda.size() + kv.size() + rope.size()); }
  };
  // The bytes snapshot() would copy for `positions` positions (what a prompt cache budgets).
  uint64_t snapshot_bytes(size_t positions) const;
  Snapshot snapshot(int seq);
  // Slot `seq` continues as if it had been fed the snapshot's ids: the next ids it is fed go at
  // positions snap.positions.. and give the bits they give after feeding those ids. Throws
  // runtime Error when the snapshot does not fit the slot (sizes of another model or capacity).
  void restore(int seq, const Snapshot& snap);
  // Called after every pass of a step for each row the pass fed but did not finish (its slot then
  // holds a prefix of the row's ids): the caller may snapshot it. Unset: nothing is called.
  void set_after_partial_pass(std::function<void(int seq)> f) { after_partial_ = std::move(f); }

  // What a sequence has pending before a step: a prompt's ids not yet fed, or the one id it sampled.
  struct Pending {
    int seq = 0;
    size_t ids = 0;       // ids pending (>= 1)
    bool prompt = false;  // still feeding its prompt (it samples once all of it is fed)
  };
  void set_prefill(PrefillPolicy p) { prefill_ = p; }
  const PrefillPolicy& prefill() const { return prefill_; }
  // How many of its pending ids each sequence feeds in the next step under prefill(); 0: it skips
  // the step. Inline: every sequence feeds, a prompt up to `chunk` ids. Separate: while any prompt is
  // pending, only prompts feed (up to `chunk` ids each); otherwise every decoding sequence.
  std::vector<size_t> plan_step(std::span<const Pending>) const;

  // Feeds every row. Rows name distinct slots in [0, max_seqs). Before anything is computed the
  // rows are checked (ids in the vocabulary, room in each slot's KV cache, distinct slots): a bad
  // row throws io::Error naming its slot and no state changes. Non-finite logits in a row throw
  // run_invalid (exit 4) naming the slot and the layer, after the step (the other rows' states
  // have advanced; the failing slot must be reset).
  void step(std::span<const Row> rows);
  // The checks step() makes before it computes anything (the same on every rank for the same rows).
  void check_rows(std::span<const Row> rows) const;

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
  PrefillPolicy prefill_;
  std::vector<float> pass_logits_;
  std::vector<int32_t> pass_ids_;
  std::function<void(int seq)> after_partial_;
};

}  // namespace k3::pipeline
