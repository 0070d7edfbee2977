#include "stages/head.hpp"

#include <algorithm>
#include <cstring>

#include "kernels/argmax.hpp"
#include "kernels/matmul.hpp"
#include "kernels/norms.hpp"

namespace k3::stages {

void embed_tokens(const HeadWeights& w, const io::ModelConfig& c, std::span<const int32_t> ids,
                  std::span<float> out) {
  const size_t E = static_cast<size_t>(c.hidden);
  for (size_t t = 0; t < ids.size(); ++t) {
    const size_t row = static_cast<size_t>(ids[t]) * E;
    std::span<float> dst = out.subspan(t * E, E);
    if (const auto* f = std::get_if<kernels::F32Matrix>(&w.embed)) {
      std::copy_n(f->data.begin() + row, E, dst.begin());
    } else {
      const auto& b = std::get<kernels::Bf16Matrix>(w.embed);
      for (size_t i = 0; i < E; ++i) dst[i] = kernels::bf16_to_f32(b.data[row + i]);
    }
  }
}

std::optional<EmbedRows> embed_rows_of(const io::ShardSet& shards, const io::ModelConfig& c) {
  std::vector<TensorSpec> specs = model_tensors(c);
  std::erase_if(specs, [](const TensorSpec& s) { return s.field != Field::embed; });
  const Layout lay = locate(std::move(specs), shards, c);
  const io::TensorInfo& t = lay.places.at(0).info;
  if (t.dtype != io::DType::BF16 && t.dtype != io::DType::F32) return std::nullopt;
  return EmbedRows{.file = &shards.shard_file(t.shard),
                   .offset = t.offset,
                   .dtype = t.dtype,
                   .hidden = static_cast<size_t>(c.hidden)};
}

std::vector<TensorSpec> head_tensors_without_embed(const io::ModelConfig& c) {
  std::vector<TensorSpec> specs = model_tensors(c);
  std::erase_if(specs, [](const TensorSpec& s) { return s.field == Field::embed; });
  return specs;
}

void embed_rows(const EmbedRows& e, std::span<const int32_t> ids, std::span<float> out,
                std::span<std::byte> row) {
  const size_t E = e.hidden, rb = e.row_bytes();
  std::span<std::byte> dst_row = row.first(rb);
  for (size_t t = 0; t < ids.size(); ++t) {
    e.file->read_exact(e.offset + static_cast<uint64_t>(ids[t]) * rb, dst_row);
    std::span<float> dst = out.subspan(t * E, E);
    if (e.dtype == io::DType::F32) {
      std::memcpy(dst.data(), dst_row.data(), rb);
    } else {
      for (size_t i = 0; i < E; ++i) {
        uint16_t v;
        std::memcpy(&v, dst_row.data() + 2 * i, 2);
        dst[i] = kernels::bf16_to_f32(v);
      }
    }
  }
}

void lm_head(const HeadWeights& w, const io::ModelConfig& c, std::span<const float> h, size_t n,
             std::span<float> logits, std::span<float> scratch) {
  const size_t E = static_cast<size_t>(c.hidden);
  std::span<float> x = scratch.first(n * E);
  for (size_t i = 0; i < n; ++i)
    kernels::rmsnorm(h.subspan(i * E, E), w.final_norm, c.rms_eps, x.subspan(i * E, E));
  kernels::matmul(w.lm_head, x, n, logits.first(n * static_cast<size_t>(c.vocab)));
}

int32_t greedy(std::span<const float> logits) {
  return static_cast<int32_t>(kernels::argmax(logits));
}

}  // namespace k3::stages
