// Model-level stages: the embedding gather and the output head (docs/model.md §3.2).
#pragma once
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "io/config.hpp"
#include "io/file.hpp"
#include "io/safetensors.hpp"
#include "stages/bind.hpp"
#include "stages/tensors.hpp"

namespace k3::stages {

// out[t] = embed[ids[t]], bf16 rows widened exactly. Ids must be < vocab (checked by the caller).
void embed_tokens(const HeadWeights&, const io::ModelConfig&, std::span<const int32_t> ids,
                  std::span<float> out);

// The embedding left on disk (the streaming engine, docs/design.md §3.3): a call needs one row per
// id, a few KiB, where the whole table is vocab x hidden (364 MiB for a 46592 x 4096 BF16 table, 2.19
// GiB for K3's). Rows are read from the checkpoint's file as a call's ids arrive and widened exactly
// as embed_tokens widens them, so the floats are the same.
struct EmbedRows {
  const io::File* file = nullptr;
  uint64_t offset = 0;  // the tensor's first byte in `file`
  io::DType dtype = io::DType::BF16;
  size_t hidden = 0;
  size_t row_bytes() const { return hidden * io::dtype_size(dtype); }
};
// Where the embedding's rows can be read from, when its dtype is one embed_tokens takes as it is
// (BF16 or F32); nullopt otherwise (an F16 table is widened at bind and stays resident). Throws
// like stages::locate when the tensor is missing or misshapen.
std::optional<EmbedRows> embed_rows_of(const io::ShardSet&, const io::ModelConfig&);
// model_tensors without embed_tokens (what a head with EmbedRows holds resident).
std::vector<TensorSpec> head_tensors_without_embed(const io::ModelConfig&);
// out[t] = the embedding row of ids[t], read through `row` (row_bytes() long). Ids must be < vocab.
// Throws io::Error naming the file when a read fails.
void embed_rows(const EmbedRows&, std::span<const int32_t> ids, std::span<float> out,
                std::span<std::byte> row);

// logits[i] = lm_head * RMSNorm(h[i]; norm.weight) for n rows of h (already aggregated by the
// model-level AttnRes). scratch: n*hidden floats.
void lm_head(const HeadWeights&, const io::ModelConfig&, std::span<const float> h, size_t n,
             std::span<float> logits, std::span<float> scratch);

// Greedy: first index of the maximum.
int32_t greedy(std::span<const float> logits);

}  // namespace k3::stages
