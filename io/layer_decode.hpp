// Decoding one coded trunk layer (io/codec's Stream over the bytes a read left in a slot) into its
// raw image, spread over oneTBB's workers: what the streamed graph's decode stage calls, so the
// node itself only chooses which blocks and where they go (docs/codec.md, "The decode stage").
#pragma once
#include <cstddef>
#include <cstdint>
#include <span>
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

}  // namespace k3::io
