// Decoding one coded trunk layer (io/codec's Stream over the bytes a read left in a slot) into its
// raw image, spread over oneTBB's workers: the streamed graph's decode stage makes one call,
// decode_layer, which also chooses the blocks of a fused layer (docs/codec.md, "The decode stage").
#pragma once
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "io/codec/codec.hpp"

namespace k3::io {

// Decodes `blocks` (ascending block indices of `st`) into `into`, the part of the raw image that
// starts at raw byte `into_at`; `verify` checks each block's check word. Runs of consecutive blocks
// are decoded in one call, 16 blocks (128 KiB decoded for exp4 and exp3) to a task.
void decode_blocks(const codec::Stream& st, std::span<const uint32_t> blocks, std::span<std::byte> into,
                   uint64_t into_at, bool verify);

// A fused layer's first pass: the whole layer is decoded in order through `window` (kept by the
// caller between layers, 1 MiB decoded at a time), every block check verified, and only the
// `staged` blocks (ascending) copied to their place in `dst` (the raw image; its other pages are
// never touched). Returns the XXH64 of the whole decoded layer, as pack-trunk recorded it.
uint64_t decode_staged_hashing(const codec::Stream& st, std::span<const uint32_t> staged,
                               std::span<std::byte> dst, std::vector<std::byte>& window);

// Byte ranges [first, second) of a layer's decoded image, ascending and disjoint.
using ByteRanges = std::vector<std::pair<uint64_t, uint64_t>>;

// The blocks of a fused layer the decode stage decodes (the matvecs decode the rest): those not
// wholly inside a `coded` range, for an image of `raw_bytes` in blocks of `block_bytes`.
std::vector<uint32_t> staged_blocks(const ByteRanges& coded, uint64_t raw_bytes, uint64_t block_bytes);

// What decode_layer reuses from layer to layer: the block list and the first pass's window.
struct LayerDecodeScratch {
  std::vector<uint32_t> blocks;
  std::vector<std::byte> window;
};

// The decode stage's one call for a coded trunk layer (`st` over the bytes its read left in a slot):
// - `fused` null: every block is decoded into `dst`, the raw image, each block check verified when
//   `verify`; returns nothing;
// - `fused`: the ranges the matvecs decode from the stored bytes themselves; only staged_blocks of
//   them are decoded into `dst`. With `verify` (the layer's first pass) the whole layer goes through
//   a window instead, every check verified, and the XXH64 of its decoded bytes is returned for the
//   caller to hold against the packed trunk's record.
std::optional<uint64_t> decode_layer(const codec::Stream& st, std::span<std::byte> dst,
                                     const ByteRanges* fused, bool verify, LayerDecodeScratch& scratch);

}  // namespace k3::io
