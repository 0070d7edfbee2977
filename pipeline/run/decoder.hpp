// One sequence decoded by the engine: the model (weights bound resident, or streamed through the
// flow graph within a budget), the state carried between calls (KDA recurrent + conv state, MLA KV
// cache) and every id of the sequence so far. `generate` and `chat` both drive it:
//   push() appends ids without computing; logits() feeds what is pending and returns the logits
//   of the last position. The last sampled id stays pending until the next logits() call, which
//   is what the K3ST state file records (its seq ends with the id not yet in the cache).
// Incremental decoding is the default; `recompute` zeroes the state and feeds the whole sequence
// on every call (the reference-check mode). Both give the same bits.
#pragma once
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "io/config.hpp"
#include "io/safetensors.hpp"
#include "pipeline/run/state_file.hpp"
#include "pipeline/run/streaming_run.hpp"
#include "pipeline/support/progress.hpp"
#include "stages/bind.hpp"
#include "stages/forward.hpp"
#include "stages/scratch.hpp"

namespace k3::pipeline {

struct DecoderOptions {
  std::string model_dir;
  std::optional<std::string> config;  // config.json to use instead of MODEL_DIR/config.json
  int layers = 0;                     // <= 0 or >= n_layers: all
  bool recompute = false;
  size_t capacity = 0;     // positions the KV cache holds (history + prompt + generated + 1); a
                           // larger stream.context (--context) replaces it, a smaller one is refused
  int expected_calls = 1;  // forward calls the streamed graph may read ahead for
  StreamFlags stream;
  // Expert parallel (docs/distributed.md §2, §6): one rank of `ranks`, resident or streamed, holding
  // and computing only the experts this owns.
  stages::ExpertExchange* experts = nullptr;
  int ranks = 1;
};

// MODEL_DIR/config.json (or --config), refused as a usage error (exit 2) when missing; a
// config.json whose content is wrong is a runtime error (exit 1) naming the file and field.
io::ModelConfig load_model_config(const std::string& model_dir, const std::optional<std::string>& config);

// The KV cache's positions: --context when given, else o.capacity. Throws usage Error (exit 2) for
// --strategy without a budget or a --context smaller than o.capacity.
size_t run_capacity(const DecoderOptions& o);

// What Decoder and BatchEngine share: the layers bound (--layers; <= 0 or >= n_layers: all), the
// shard index (printed: tensors, shards, seconds), the resident weights (a progress bar, then a
// line of what was bound), the progress mode of the stream flags, and the check that a step's
// logits are finite (run_invalid, exit 4, naming the first non-finite layer; `whose` prefixes the
// message, e.g. "sequence 3: ").
int bound_layers(const io::ModelConfig&, int layers);
io::ShardSet open_model_shards(const std::string& dir);
std::unique_ptr<stages::ResidentModel> load_resident(const io::ShardSet&, const io::ModelConfig&,
                                                     int n_layers, Progress::Mode,
                                                     stages::ExpertExchange* experts = nullptr);
Progress::Mode progress_mode(const StreamFlags&);
void check_logits_finite(const io::ModelConfig&, const stages::DecodeState&, std::span<const float> logits,
                         const std::string& whose);

class Decoder {
 public:
  // Prints what it loads (index, weights or the streaming plan, state sizes) to stdout; progress
  // bars for the resident load and the first step go to stderr (stream.progress / no_progress).
  // Throws usage Error (exit 2), before reading anything, for --strategy without a budget or a
  // --context smaller than `capacity`.
  Decoder(const DecoderOptions&, io::ModelConfig);
  ~Decoder();

  const io::ModelConfig& config() const { return cfg_; }
  int n_layers() const { return n_layers_; }
  size_t capacity() const { return state_.capacity(); }
  bool recompute() const { return recompute_; }
  StreamRun* stream() { return stream_.get(); }
  const std::vector<int32_t>& seq() const { return seq_; }
  size_t pending() const { return seq_.size() - state_.cached; }
  // Positions still free: what may be pushed before logits() would overflow the KV cache.
  size_t room() const { return state_.capacity() > seq_.size() ? state_.capacity() - seq_.size() : 0; }

  void push(std::span<const int32_t> ids);
  void push(int32_t id) { push(std::span<const int32_t>(&id, 1)); }
  // Feeds the pending ids (needs at least one) and returns the last position's logits, valid until
  // the next call. Throws io::Error on a bad id or a full KV cache, leaving the state as it was;
  // run_invalid (exit 4) when the logits are not finite, naming the first layer whose output was not.
  std::span<const float> logits();

  // A speculative verify pass (pipeline/run/speculative.hpp): needs exactly one pending id and
  // incremental decoding. Pushes `drafts`, feeds the pending id and them as one pass of
  // 1 + drafts.size() rows with the KDA layers journaled, and returns every row's logits (row i at
  // i * vocab), valid until the next call. keep(n) must follow: it keeps the pass's first n rows
  // (1..rows) in the state and the sequence, as if only they had been fed, and drops the others.
  std::span<const float> verify(std::span<const int32_t> drafts);
  void keep(size_t rows);
  uint64_t journal_bytes(size_t rows) const { return state_.journal_bytes(rows); }

  void reset();  // forget the sequence and zero the state
  // K3ST files, compatible with the reference engines (pipeline/run/state_file.hpp).
  uint64_t save(const std::filesystem::path&);
  void load(const std::filesystem::path&);

 private:
  io::ModelConfig cfg_;
  int n_layers_;
  bool recompute_;
  Progress::Mode progress_;
  bool first_step_ = true;
  size_t capacity_;  // checked before the shards are indexed
  io::ShardSet shards_;
  std::unique_ptr<StreamRun> stream_;
  std::unique_ptr<stages::ResidentModel> model_;
  stages::DecodeState state_;
  stages::Scratch scratch_;
  std::vector<float> logits_;
  std::vector<int32_t> seq_;
};

}  // namespace k3::pipeline
