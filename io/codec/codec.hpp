// Lossless codecs for bf16 arrays (docs/codec.md). A bf16 value is sign(1) exponent(8) mantissa(7);
// trained weights use a narrow band of exponents, so both codecs keep the sign+mantissa byte raw and
// code only the exponent:
//   exp4: per block a base exponent and a 4-bit offset per value (15 = escape: position and exponent
//         in a list after the block), ~12 bits/value; SIMD-decodable (scalar, AVX2, AVX-512 bodies).
//   exp3: per block a base exponent and a 3-bit code per value (7 = escape: its exponent byte in a
//         list after the block, in value order), ~11.2 bits/value on weights; scalar, AVX2,
//         AVX-512 bodies. The trunk default's alternative to exp4: ~4-5 points smaller.
//   huff: per block a canonical Huffman code (lengths <= 12) over the exponent byte; ~10-11
//         bits/value on weight-like data; scalar table decode, slower.
//
// Stream (little-endian), any byte length (an odd last byte is kept in the header):
//   [0,40)  header: "K3CZ", version u8 = 1, codec u8, 0 u8, tail_flag u8, tail_byte u8, 0 u8[3],
//           block_values u32, n_blocks u32, 0 u32, raw_bytes u64, check u64
//   [40, 40 + 16 n_blocks)  block index: per block {end u64 (from the data start), check u64}
//   data: the blocks back to back; block b holds values [b*block_values, ...) of raw_bytes/2.
// A block that coding would not shrink is stored raw (4-byte header 0,1,0,0 then the values).
// header.check hashes bytes [0,32) and the index; a block's check hashes its stored bytes, so a
// flipped bit anywhere is refused naming the block and its byte offset (when checks are verified).
// Without verification every structural field is still bounds-checked: a malformed stream never
// reads or writes out of bounds, it is refused.
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kernels/dispatch.hpp"
#include "kernels/weights.hpp"

namespace k3::io::codec {

enum class Codec : uint8_t { none = 0, exp4 = 1, huff = 2, exp3 = 3 };
const char* codec_name(Codec);
std::optional<Codec> parse_codec(std::string_view);  // "none" | "exp4" | "huff" | "exp3"

// exp4 and exp3 decode fast enough (SIMD, ~10 GB/s a core) to decode inside the matvecs (the fused
// decode, kernels::CodedBf16Matrix); huff does not (docs/codec.md, "Fused decode").
inline bool fused_decode(Codec c) {
  return c == Codec::exp4 || c == Codec::exp3;
}

constexpr size_t kHeaderBytes = 40;
constexpr size_t kIndexEntryBytes = 16;
uint32_t default_block_values(Codec);  // exp4 and exp3 4096, huff 65536
// block_values must be a power of two in [64, max_block_values(codec)].
uint32_t max_block_values(Codec);  // exp4 and exp3 32768, huff 65536

struct EncodeOptions {
  Codec codec = Codec::exp4;
  uint32_t block_values = 0;  // 0: default_block_values(codec)
};

// Encodes `raw` (any length; read as little-endian bf16 values). Throws Error on a bad option.
std::vector<std::byte> encode(std::span<const std::byte> raw, const EncodeOptions& opt);

// A parsed, header-validated stream. `what` names it in every error ("trunk.bin layer 3").
// `base_offset` is added to every byte offset an error reports (the stream's place in its file).
class Stream final : public kernels::Bf16Source {
 public:
  // Validates the header, the index (ends in order, last end == stream end) and, when `verify`,
  // the header check. Throws runtime Error "codec: <what>: ... at byte offset N".
  static Stream parse(std::span<const std::byte> stream, std::string what, uint64_t base_offset = 0,
                      bool verify = true);

  Codec codec() const { return codec_; }
  uint64_t raw_bytes() const { return raw_bytes_; }
  uint32_t n_blocks() const { return n_blocks_; }
  uint32_t block_values() const { return block_values_; }
  uint64_t block_raw_offset(uint32_t b) const { return uint64_t(b) * block_values_ * 2; }

  // Decodes blocks [first, end) into out[block_raw_offset(first), ...); `out` is the WHOLE raw
  // output (raw_bytes() long). Disjoint block ranges may be decoded by different threads at once.
  // With `verify`, each block's check is compared first. The last block also writes the odd tail
  // byte. Throws runtime Error naming the block and its byte offset.
  void decode_blocks(uint32_t first, uint32_t end, std::span<std::byte> out, bool verify) const;
  void decode(std::span<std::byte> out, bool verify) const { decode_blocks(0, n_blocks_, out, verify); }
  // decode_blocks into `out` holding exactly blocks [first, end)'s decoded bytes (and the odd tail
  // byte when end == n_blocks()): block `first` at out[0] (a window of a layer, streamed past).
  void decode_blocks_to(uint32_t first, uint32_t end, std::span<std::byte> out, bool verify) const;
  // Where block b's decoded bytes start (block_raw_offset, capped at the values' end).
  uint64_t block_start(uint32_t b) const { return std::min(block_raw_offset(b), raw_bytes_ / 2 * 2); }
  // Where blocks [.., end) end: block_start(end), or raw_bytes() (the tail byte) when end == n_blocks().
  uint64_t blocks_end(uint32_t end) const { return end >= n_blocks_ ? raw_bytes_ : block_start(end); }

  // Values [first, first + count) of the decoded array (bf16 values, the odd tail byte excluded)
  // into out, block checks not verified: the fused matvec's tiles (kernels::CodedBf16Matrix). A
  // block the range cuts is decoded whole into a scratch and the part asked for copied. Thread-safe.
  void decode_values(uint64_t first, uint64_t count, uint16_t* out) const override;
  // exp3: views of the blocks holding values [first, first + count) for the fused exp3 body (no
  // check verified, every block header validated; false for another codec or a malformed header).
  bool exp3_blocks(uint64_t first, uint64_t count, std::vector<kernels::Exp3Block>& out) const override;

 private:
  void decode_block(uint32_t b, uint16_t* out, bool verify) const;

  std::span<const std::byte> bytes_;
  std::string what_;
  uint64_t base_ = 0;
  Codec codec_ = Codec::none;
  uint32_t block_values_ = 0, n_blocks_ = 0;
  uint64_t raw_bytes_ = 0;
  bool has_tail_ = false;
  std::byte tail_{};
  size_t data_off_ = 0;
};

// Convenience: parse + decode into a new vector (verify on).
std::vector<std::byte> decode(std::span<const std::byte> stream, std::string what = "stream");

// Recomputes every block check and the header check in place (tests and fuzzing build
// structurally corrupted streams with valid checks to reach the structural validation).
// Does nothing to a stream too short for its header and index.
void reseal(std::span<std::byte> stream);

// The hash behind the checks (4-lane multiply-rotate over 32-byte stripes, ~20 GB/s).
uint64_t check_hash(std::span<const std::byte> bytes, uint64_t seed = 0);

// Tests: which decode bodies ran (exp4 and exp3 have scalar, avx2, avx512; huff only scalar).
std::vector<kernels::Isa> built_exp4_isas();
uint64_t exp4_body_runs(kernels::Isa);
std::vector<kernels::Isa> built_exp3_isas();
uint64_t exp3_body_runs(kernels::Isa);

}  // namespace k3::io::codec
