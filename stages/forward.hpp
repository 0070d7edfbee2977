// The whole model over new tokens (MODEL.md §3.2, §3.9): embedding -> decoder layers -> model-level
// AttnRes -> final norm -> lm_head. One function serves both decoding modes:
//   full recompute: state.reset() before every pass, feed the whole prefix;
//   incremental:    reset once, feed the prompt, then one token per call (KDA recurrent + conv
//                   state carried, MLA KV cache extended, the block stack rebuilt per call).
#pragma once
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "io/config.hpp"
#include "stages/bind.hpp"
#include "stages/layer.hpp"
#include "stages/scratch.hpp"

namespace k3::stages {

// Everything carried between calls, laid out as the K3ST state file stores it (ENGINE.md §5.7):
// kper floats of KDA + ShortConv state for EVERY bound layer (MLA layers' slices stay zero), and
// per MLA layer `capacity` KV rows of kvpp floats and rope rows of ropepp floats.
class DecodeState {
 public:
  DecodeState(const io::ModelConfig&, int n_bound, size_t kv_capacity);

  void reset();  // zero the KDA state, forget every cached position
  LayerState layer(int l);

  size_t cached = 0;  // positions already fed
  int n_bound() const { return n_bound_; }
  int n_mla() const { return n_mla_; }
  size_t capacity() const { return capacity_; }
  size_t kper() const { return kper_; }
  size_t kvpp() const { return kvpp_; }
  size_t ropepp() const { return ropepp_; }
  std::span<float> kda_all() { return kda_; }
  std::span<float> kv_rows(int mla_ordinal, size_t n) {
    return std::span(kv_).subspan(mla_ordinal * capacity_ * kvpp_, n * kvpp_);
  }
  std::span<float> rope_rows(int mla_ordinal, size_t n) {
    return std::span(rope_).subspan(mla_ordinal * capacity_ * ropepp_, n * ropepp_);
  }

 private:
  const io::ModelConfig* cfg_;
  int n_bound_, n_mla_ = 0;
  size_t capacity_, kper_, kvpp_, ropepp_;
  std::vector<int> mla_ordinal_;
  std::vector<float> kda_, kv_, rope_;
};

enum class HeadAt { last, all };

// The checks every forward pass makes before touching state: at least one id, every id inside the
// vocabulary, room in the MLA KV cache. Throws io::Error naming the id or the positions.
void check_forward_inputs(const io::ModelConfig&, const DecodeState&, std::span<const int32_t> ids);

// Feeds `ids` at positions state.cached.. and advances state.cached. logits: vocab floats for
// HeadAt::last (the last new position), ids.size() * vocab for HeadAt::all (teacher forcing).
// Throws io::Error on KV overflow or an out-of-range id.
void forward(const WeightSource&, DecodeState&, std::span<const int32_t> ids, HeadAt, std::span<float> logits,
             Scratch&);

}  // namespace k3::stages
