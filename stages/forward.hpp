// The whole model over new tokens (docs/model.md §3.2, §3.9): embedding -> decoder layers -> model-level
// AttnRes -> final norm -> lm_head. One function serves both decoding modes:
//   full recompute: state.reset() before every pass, feed the whole prefix;
//   incremental:    reset once, feed the prompt, then one token per call (KDA recurrent + conv
//                   state carried, MLA KV cache extended, the block stack rebuilt per call).
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "io/config.hpp"
#include "stages/bind.hpp"
#include "stages/layer.hpp"
#include "stages/scratch.hpp"

namespace k3::stages {

// The bytes a DecodeState holds, from the config alone. The planner counts exactly these terms and
// the DecodeState constructor allocates exactly these, so the plan and the allocation are one
// computation and cannot disagree.
//   KDA recurrent + conv state: kper floats per KDA layer (MLA layers have none);
//   MLA KV cache: per MLA layer `capacity` KV rows of kvpp floats and rope rows of ropepp floats.
struct StateSizes {
  int n_bound = 0, n_kda = 0, n_mla = 0;  // bound layers and how many of them are KDA / MLA
  size_t capacity = 0;                    // positions the MLA KV cache holds
  size_t kper = 0, kvpp = 0, ropepp = 0;  // floats: K3ST header fields of the same names

  static StateSizes of(const io::ModelConfig&, int n_bound, size_t capacity);
  uint64_t kda_layer_bytes() const { return 4 * uint64_t(kper); }
  uint64_t kda_bytes() const { return uint64_t(n_kda) * kda_layer_bytes(); }
  // One position's KV + rope rows over all MLA layers.
  uint64_t kv_position_bytes() const { return 4 * uint64_t(kvpp + ropepp) * uint64_t(n_mla); }
  uint64_t kv_bytes() const { return uint64_t(capacity) * kv_position_bytes(); }
  uint64_t bytes() const { return kda_bytes() + kv_bytes(); }
};

// What a forward pass reports besides its outputs, for whoever drives the calls: where the hidden
// state first went non-finite (so an invalid run can name the layer, not only the position), and
// progress layer by layer. Both forward paths (forward() below, the streamed graph) fill it. It only
// reads the hidden state: no computed bit depends on it.
struct ForwardWatch {
  static constexpr int kNone = -2, kEmbedding = -1;
  int nonfinite_layer = kNone;    // first layer whose output held NaN or inf (kEmbedding: the embedding)
  size_t nonfinite_position = 0;  // the first such position in that output
  // After each layer of a call: layers done of `total`; a streamed run adds the pinned trunk bytes
  // loaded so far of their total (0 of 0 otherwise). Unset: nothing is called.
  std::function<void(int done, int total, uint64_t pinned_done, uint64_t pinned_total)> on_layer;

  // Scans `hidden` ([T][E], positions first_position..) once nothing is recorded yet: one pass over
  // T x E floats per layer, next to the layer's own O(T x E x width) work.
  void after_layer(int layer, std::span<const float> hidden, size_t E, size_t first_position) {
    if (nonfinite_layer == kNone) scan(layer, hidden, E, first_position);
  }
  void clear() { nonfinite_layer = kNone; }

 private:
  void scan(int layer, std::span<const float> hidden, size_t E, size_t first_position);
};

// "layer 3 (MLA, MoE)", "the embedding": where ForwardWatch::nonfinite_layer points.
std::string describe_layer(const io::ModelConfig&, int layer);

// Everything carried between calls: KDA + ShortConv state for the KDA layers only (kper floats
// each, in layer order) and the MLA layers' KV and rope rows. The K3ST state file stores kper floats
// for EVERY bound layer, MLA layers' slices zero, as the reference engines do; pipeline/run/state_file.*
// maps between that layout and this one.
class DecodeState {
 public:
  DecodeState(const io::ModelConfig&, int n_bound, size_t kv_capacity);

  void reset();  // zero the KDA state, forget every cached position (and what `watch` recorded)
  LayerState layer(int l);

  size_t cached = 0;  // positions already fed
  ForwardWatch watch;
  const StateSizes& sizes() const { return sizes_; }
  int n_bound() const { return sizes_.n_bound; }
  int n_mla() const { return sizes_.n_mla; }
  size_t capacity() const { return sizes_.capacity; }
  size_t kper() const { return sizes_.kper; }
  size_t kvpp() const { return sizes_.kvpp; }
  size_t ropepp() const { return sizes_.ropepp; }
  uint64_t kda_bytes() const { return sizes_.kda_bytes(); }
  uint64_t kv_bytes() const { return sizes_.kv_bytes(); }
  // What the vectors really hold (their capacities), for tests that hold the plan to it.
  uint64_t allocated_bytes() const {
    return 4 * uint64_t(kda_.capacity() + kv_.capacity() + rope_.capacity());
  }

  // Layer l's kper floats of KDA + conv state; empty for an MLA layer.
  std::span<float> kda_layer(int l);
  std::span<float> kv_rows(int mla_ordinal, size_t n) {
    return std::span(kv_).subspan(mla_ordinal * capacity() * kvpp(), n * kvpp());
  }
  std::span<float> rope_rows(int mla_ordinal, size_t n) {
    return std::span(rope_).subspan(mla_ordinal * capacity() * ropepp(), n * ropepp());
  }

  // A speculative verify pass (docs/speculative.md): begin_journal(rows) makes the next pass (of at
  // most `rows` rows, starting at `cached`) record each KDA layer's state on entry and its rows'
  // recurrence inputs (stages/kda.hpp KdaJournal); keep(n) then leaves the state as if only the
  // pass's first n rows had been fed -- the MLA cache simply forgets the rows past them, the KDA
  // layers are restored and their recurrence replayed -- and ends the journal. The journal's memory
  // (journal_bytes) is allocated on the first use and kept.
  void begin_journal(size_t rows);
  void keep(size_t rows);
  bool journaling() const { return journaling_; }
  uint64_t journal_bytes(size_t rows) const;

 private:
  const io::ModelConfig* cfg_;
  StateSizes sizes_;
  std::vector<int> kda_ordinal_, mla_ordinal_;  // per bound layer; -1 where the layer is the other kind
  std::vector<float> kda_, kv_, rope_;
  std::vector<float> journal_mem_;
  std::vector<KdaJournal> journals_;  // per KDA layer, views of journal_mem_
  bool journaling_ = false;
  size_t journal_start_ = 0;  // `cached` when the journal began
};

enum class HeadAt { last, all };

// The checks every forward pass makes before touching state: at least one id, every id inside the
// vocabulary, room in the MLA KV cache. Throws io::Error naming the id or the positions.
void check_forward_inputs(const io::ModelConfig&, const DecodeState&, std::span<const int32_t> ids);

// Feeds `ids` at positions state.cached.. and advances state.cached. logits: vocab floats for
// HeadAt::last (the last new position), ids.size() * vocab for HeadAt::all (teacher forcing).
// Throws io::Error on KV overflow or an out-of-range id. The one-segment case of forward_batch.
void forward(const WeightSource&, DecodeState&, std::span<const int32_t> ids, HeadAt, std::span<float> logits,
             Scratch&);

// One sequence's part of a batched pass: ids[first_row, first_row + rows) are fed to `state`.
struct Segment {
  DecodeState* state = nullptr;
  size_t first_row = 0, rows = 0;
};

// check_forward_inputs for every segment, and that the segments are in row order, cover every id
// without a gap, have at least one row each and name distinct states. Throws io::Error naming the
// segment ("segment 2: ...").
void check_segments(const io::ModelConfig&, std::span<const Segment>, std::span<const int32_t> ids);

// The per-layer views of a pass's segments (their states' layer l at their current positions).
std::vector<LayerSegment> layer_segments(std::span<const Segment>, int layer);

// One pass over several sequences (a batched decode step): the segments' ids concatenated, every
// row-wise stage (embedding, norms, AttnRes, every matmul, router, experts over the rows that chose
// them, combine, head) run once over all of them, only the attention per segment on its own state.
// logits: segments.size() * vocab floats, segment i's last row's logits at i * vocab. Each
// segment's logits and state are bit-identical to forward() on that sequence alone. Advances every
// state's `cached` by its rows; non-finite hidden states are recorded in each state's own watch.
void forward_batch(const WeightSource&, std::span<const Segment>, std::span<const int32_t> ids,
                   std::span<float> logits, Scratch&);

}  // namespace k3::stages
