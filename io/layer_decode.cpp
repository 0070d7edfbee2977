#include "io/layer_decode.hpp"

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include <algorithm>
#include <cstring>
#include <numeric>

#include "io/xxh64.hpp"

namespace k3::io {

void decode_blocks(const codec::Stream& st, std::span<const uint32_t> blocks, std::span<std::byte> into,
                   uint64_t into_at, bool verify) {
  tbb::parallel_for(
      tbb::blocked_range<size_t>(0, blocks.size(), 16), [&](const tbb::blocked_range<size_t>& b) {
        for (size_t i = b.begin(); i < b.end();) {
          size_t j = i + 1;
          while (j < b.end() && blocks[j] == blocks[j - 1] + 1) ++j;
          const uint64_t at = st.block_start(blocks[i]);
          st.decode_blocks_to(
              blocks[i], blocks[j - 1] + 1,
              into.subspan(size_t(at - into_at), size_t(st.blocks_end(blocks[j - 1] + 1) - at)), verify);
          i = j;
        }
      });
}

uint64_t decode_staged_hashing(const codec::Stream& st, std::span<const uint32_t> staged,
                               std::span<std::byte> dst, std::vector<std::byte>& window) {
  constexpr uint32_t kWindowBlocks = 128;  // 1 MiB decoded for exp4 and exp3
  Xxh64 h;
  std::vector<uint32_t> all;
  size_t k = 0;
  for (uint32_t w0 = 0; w0 < st.n_blocks(); w0 += kWindowBlocks) {
    const uint32_t w1 = std::min(st.n_blocks(), w0 + kWindowBlocks);
    const uint64_t at = st.block_start(w0), len = st.blocks_end(w1) - at;
    window.resize(size_t(len));
    all.resize(w1 - w0);
    std::iota(all.begin(), all.end(), w0);
    decode_blocks(st, all, window, at, true);
    h.update(window);
    for (; k < staged.size() && staged[k] < w1; ++k) {
      const uint64_t b0 = st.block_start(staged[k]), b1 = st.blocks_end(staged[k] + 1);
      std::memcpy(dst.data() + b0, window.data() + (b0 - at), size_t(b1 - b0));
    }
  }
  return h.digest();
}

std::vector<uint32_t> staged_blocks(const ByteRanges& coded, uint64_t raw_bytes, uint64_t block_bytes) {
  std::vector<uint32_t> todo;
  size_t k = 0;
  for (uint64_t b0 = 0; b0 < raw_bytes; b0 += block_bytes) {
    const uint64_t b1 = std::min(b0 + block_bytes, raw_bytes);
    while (k < coded.size() && coded[k].second <= b0) ++k;
    if (k < coded.size() && coded[k].first <= b0 && b1 <= coded[k].second) continue;
    todo.push_back(uint32_t(b0 / block_bytes));
  }
  return todo;
}

std::optional<uint64_t> decode_layer(const codec::Stream& st, std::span<std::byte> dst,
                                     const ByteRanges* fused, bool verify, LayerDecodeScratch& scratch) {
  std::vector<uint32_t>& todo = scratch.blocks;
  if (fused) {
    todo = staged_blocks(*fused, st.raw_bytes(), uint64_t(st.block_values()) * 2);
    // The first pass: the decoded slot holds only the staged blocks, so the whole layer is decoded
    // through the window and hashed as it passes.
    if (verify) return decode_staged_hashing(st, todo, dst, scratch.window);
  } else {
    todo.resize(st.n_blocks());
    std::iota(todo.begin(), todo.end(), 0u);
  }
  decode_blocks(st, todo, dst, 0, verify);
  return std::nullopt;
}

}  // namespace k3::io
