// The K3ST saved-state file (docs/engine.md §5.7), byte-compatible with the reference engines:
// a 96-byte little-endian header (magic, version 1, a 12-int config fingerprint, n_bound, n_mla,
// cached, nseq, kper, kvpp, ropepp), then int32 seq[nseq], f32 KDA+conv state kper x n_bound, per
// MLA layer `cached` KV rows, then per MLA layer `cached` rope rows (only occupied rows, so a
// resumed run may size its cache differently).
#pragma once
#include <array>
#include <cstdint>
#include <filesystem>
#include <vector>

#include "io/config.hpp"
#include "stages/forward.hpp"

namespace k3::pipeline {

struct StateHeader {
  int32_t version = 0;
  std::array<int32_t, 12> fingerprint{};
  int32_t n_bound = 0, n_mla = 0, cached = 0, nseq = 0;
  int64_t kper = 0, kvpp = 0, ropepp = 0;
};

constexpr size_t kStateHeaderBytes = 96;

// hidden, n_layers, vocab, kda_heads, kda_head_dim, conv_k, n_heads, qk_nope, qk_rope, v_head,
// n_experts, top_k.
std::array<int32_t, 12> state_fingerprint(const io::ModelConfig&);

// Reads and checks only the header (magic, version). Throws io::Error (runtime) naming the file.
StateHeader peek_state(const std::filesystem::path&);

// Checks the header against this run (fingerprint, bound / MLA layer counts, KV capacity, exact
// size), then fills `seq` and the state. Throws io::Error (runtime) naming the file.
void load_state(const std::filesystem::path&, const io::ModelConfig&, stages::DecodeState&,
                std::vector<int32_t>& seq);

// Streams the file from the state through a kStateWriteBuffer-byte buffer (the state is never
// copied whole) to a temporary name in the same directory, fsyncs it and renames it over `path`.
// On any failure the temporary is removed, `path` is untouched, and io::Error (runtime) names the
// path. Returns the file size.
constexpr size_t kStateWriteBuffer = size_t{1} << 20;
uint64_t save_state(const std::filesystem::path&, const io::ModelConfig&, const std::vector<int32_t>& seq,
                    stages::DecodeState&);

}  // namespace k3::pipeline
