// The stream container (header, block index, checks) around the per-block codecs in exp4.cpp,
// exp3.cpp and huff.cpp; see codec.hpp for the layout.
#include "io/codec/codec.hpp"

#include <fmt/format.h>

#include <bit>
#include <cstring>

#include "io/codec/blocks.hpp"
#include "io/error.hpp"

namespace k3::io::codec {

namespace {

constexpr char kMagic[4] = {'K', '3', 'C', 'Z'};
constexpr uint8_t kVersion = 1;
// A block whose second byte is 1 holds its values raw after a 4-byte header (0, 1, 0, 0): what
// the encoder stores when coding would not shrink the block, so no input grows by more than the
// header, index and 4 bytes a block.
constexpr uint8_t kRawBlockKind = 1;
constexpr size_t kRawBlockHead = 4;

uint64_t rd_u64(const std::byte* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}
uint32_t rd_u32(const std::byte* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
void wr_u64(std::byte* p, uint64_t v) {
  std::memcpy(p, &v, 8);
}
void wr_u32(std::byte* p, uint32_t v) {
  std::memcpy(p, &v, 4);
}

// Header check: bytes [0,32) then the index.
uint64_t header_check(std::span<const std::byte> stream, uint32_t n_blocks) {
  uint64_t h = check_hash(stream.first(32));
  return check_hash(stream.subspan(kHeaderBytes, size_t(n_blocks) * kIndexEntryBytes), h);
}

bool codes_blocks(Codec c) {
  return c == Codec::exp4 || c == Codec::huff || c == Codec::exp3;
}

bool valid_block_values(Codec c, uint64_t bv) {
  return bv >= 64 && bv <= max_block_values(c) && std::has_single_bit(bv);
}

}  // namespace

const char* codec_name(Codec c) {
  switch (c) {
    case Codec::none:
      return "none";
    case Codec::exp4:
      return "exp4";
    case Codec::huff:
      return "huff";
    case Codec::exp3:
      return "exp3";
  }
  return "unknown";
}

std::optional<Codec> parse_codec(std::string_view s) {
  for (Codec c : {Codec::none, Codec::exp4, Codec::huff, Codec::exp3})
    if (s == codec_name(c)) return c;
  return std::nullopt;
}

uint32_t default_block_values(Codec c) {
  return c == Codec::huff ? 65536 : 4096;
}
uint32_t max_block_values(Codec c) {
  return c == Codec::huff ? 65536 : 32768;
}

std::vector<std::byte> encode(std::span<const std::byte> raw, const EncodeOptions& opt) {
  if (!codes_blocks(opt.codec))
    throw usage_error(fmt::format("codec: cannot encode with codec {}", codec_name(opt.codec)));
  const uint32_t bv = opt.block_values ? opt.block_values : default_block_values(opt.codec);
  if (!valid_block_values(opt.codec, bv))
    throw usage_error(fmt::format("codec: block of {} values for {}: must be a power of two in [64, {}]", bv,
                                  codec_name(opt.codec), max_block_values(opt.codec)));
  const uint64_t n_values = raw.size() / 2;
  const uint64_t n_blocks64 = (n_values + bv - 1) / bv;
  if (n_blocks64 > UINT32_MAX)
    throw usage_error(fmt::format("codec: {} bytes is too long for one stream", raw.size()));
  const uint32_t n_blocks = uint32_t(n_blocks64);
  std::vector<std::byte> out(kHeaderBytes + size_t(n_blocks) * kIndexEntryBytes);
  out.reserve(out.size() + raw.size() * 13 / 16 + 64);
  std::memcpy(out.data(), kMagic, 4);
  out[4] = std::byte{kVersion};
  out[5] = std::byte{static_cast<uint8_t>(opt.codec)};
  const bool tail = raw.size() & 1;
  out[7] = std::byte{uint8_t(tail)};
  if (tail) out[8] = raw.back();
  wr_u32(out.data() + 12, bv);
  wr_u32(out.data() + 16, n_blocks);
  wr_u64(out.data() + 24, raw.size());
  const size_t data_off = out.size();
  std::vector<uint16_t> vals(bv);
  for (uint32_t b = 0; b < n_blocks; ++b) {
    const uint64_t first = uint64_t(b) * bv;
    const size_t n = size_t(std::min<uint64_t>(bv, n_values - first));
    std::memcpy(vals.data(), raw.data() + first * 2, n * 2);
    const size_t start = out.size();
    if (opt.codec == Codec::exp4)
      detail::exp4_encode_block(vals.data(), n, out);
    else if (opt.codec == Codec::exp3)
      detail::exp3_encode_block(vals.data(), n, out);
    else
      detail::huff_encode_block(vals.data(), n, out);
    if (out.size() - start >= kRawBlockHead + 2 * n) {  // incompressible (not weights): store raw
      out.resize(start + kRawBlockHead + 2 * n);
      std::memset(out.data() + start, 0, kRawBlockHead);
      out[start + 1] = std::byte{kRawBlockKind};
      std::memcpy(out.data() + start + kRawBlockHead, raw.data() + first * 2, n * 2);
    }
    std::byte* entry = out.data() + kHeaderBytes + size_t(b) * kIndexEntryBytes;
    wr_u64(entry, out.size() - data_off);
    wr_u64(entry + 8, check_hash(std::span(out).subspan(start)));
  }
  wr_u64(out.data() + 32, header_check(out, n_blocks));
  return out;
}

Stream Stream::parse(std::span<const std::byte> s, std::string what, uint64_t base_offset, bool verify) {
  auto bad = [&](uint64_t off, const std::string& why) {
    return runtime_error(
        fmt::format("codec: {}: header: {} (at byte offset {})", what, why, base_offset + off));
  };
  if (s.size() < kHeaderBytes)
    throw bad(s.size(), fmt::format("{} bytes, shorter than the {}-byte header", s.size(), kHeaderBytes));
  if (std::memcmp(s.data(), kMagic, 4) != 0) throw bad(0, "not a k3flow codec stream (magic is not K3CZ)");
  if (std::to_integer<uint8_t>(s[4]) != kVersion)
    throw bad(4, fmt::format("version {} (this build reads {})", std::to_integer<int>(s[4]), kVersion));
  const auto c = static_cast<Codec>(std::to_integer<uint8_t>(s[5]));
  if (!codes_blocks(c)) throw bad(5, fmt::format("unknown codec {}", std::to_integer<int>(s[5])));
  const uint8_t tail_flag = std::to_integer<uint8_t>(s[7]);
  for (size_t i :
       {size_t(6), size_t(9), size_t(10), size_t(11), size_t(20), size_t(21), size_t(22), size_t(23)})
    if (s[i] != std::byte{0}) throw bad(i, "reserved byte is not 0");
  if (tail_flag > 1 || (!tail_flag && s[8] != std::byte{0})) throw bad(7, "bad tail byte flag");
  Stream st;
  st.codec_ = c;
  st.block_values_ = rd_u32(s.data() + 12);
  st.n_blocks_ = rd_u32(s.data() + 16);
  st.raw_bytes_ = rd_u64(s.data() + 24);
  if (!valid_block_values(c, st.block_values_))
    throw bad(12, fmt::format("block of {} values for {}", st.block_values_, codec_name(c)));
  if ((st.raw_bytes_ & 1) != tail_flag) throw bad(7, "tail flag disagrees with the raw length");
  const uint64_t n_values = st.raw_bytes_ / 2;
  if ((n_values + st.block_values_ - 1) / st.block_values_ != st.n_blocks_)
    throw bad(16, fmt::format("{} blocks of {} values cannot hold {} values", st.n_blocks_, st.block_values_,
                              n_values));
  const uint64_t index_end = kHeaderBytes + uint64_t(st.n_blocks_) * kIndexEntryBytes;
  if (index_end > s.size())
    throw bad(16, fmt::format("the index of {} blocks runs past the stream end ({} bytes)", st.n_blocks_,
                              s.size()));
  if (verify && header_check(s, st.n_blocks_) != rd_u64(s.data() + 32))
    throw bad(32, "header check mismatch (header or block index corrupted)");
  uint64_t prev = 0;
  for (uint32_t b = 0; b < st.n_blocks_; ++b) {
    const uint64_t end = rd_u64(s.data() + kHeaderBytes + size_t(b) * kIndexEntryBytes);
    if (end < prev || end > s.size() - index_end)
      throw bad(kHeaderBytes + size_t(b) * kIndexEntryBytes,
                fmt::format("block {} ends at {}: before its start or past the stream end", b, end));
    prev = end;
  }
  if (index_end + prev != s.size())
    throw bad(index_end, fmt::format("blocks end at {}, the stream at {}", index_end + prev, s.size()));
  st.bytes_ = s;
  st.what_ = std::move(what);
  st.base_ = base_offset;
  st.has_tail_ = tail_flag;
  st.tail_ = s[8];
  st.data_off_ = size_t(index_end);
  return st;
}

// Block b's values, decoded (and, with `verify`, its check compared first) into o (2-aligned).
void Stream::decode_block(uint32_t b, uint16_t* o, bool verify) const {
  const std::byte* entry = bytes_.data() + kHeaderBytes + size_t(b) * kIndexEntryBytes;
  const uint64_t start = b ? rd_u64(entry - kIndexEntryBytes) : 0, stop = rd_u64(entry);
  const std::byte* blk = bytes_.data() + data_off_ + start;
  const size_t size = size_t(stop - start);
  const uint64_t block_off = base_ + data_off_ + start;
  if (verify && check_hash(std::span(blk, size)) != rd_u64(entry + 8))
    throw runtime_error(fmt::format("codec: {}: block {} (bytes {}..{}) check mismatch: corrupted", what_, b,
                                    block_off, block_off + size));
  const uint64_t v0 = uint64_t(b) * block_values_;
  const size_t n = size_t(std::min<uint64_t>(block_values_, raw_bytes_ / 2 - v0));
  try {
    if (size >= 2 && std::to_integer<uint8_t>(blk[1]) == kRawBlockKind) {
      if (size != kRawBlockHead + 2 * n || blk[0] != std::byte{0} || blk[2] != std::byte{0} ||
          blk[3] != std::byte{0})
        throw detail::BlockFault{fmt::format("raw block of {} bytes for {} values (needs {}, zero header)",
                                             size, n, kRawBlockHead + 2 * n),
                                 0};
      std::memcpy(o, blk + kRawBlockHead, n * 2);
    } else if (codec_ == Codec::exp4)
      detail::exp4_decode_block(blk, size, n, o);
    else if (codec_ == Codec::exp3)
      detail::exp3_decode_block(blk, size, n, o);
    else
      detail::huff_decode_block(blk, size, n, o);
  } catch (const detail::BlockFault& f) {
    throw runtime_error(
        fmt::format("codec: {}: block {}: {} (at byte offset {})", what_, b, f.what, block_off + f.offset));
  }
}

void Stream::decode_blocks(uint32_t first, uint32_t end, std::span<std::byte> out, bool verify) const {
  if (out.size() != raw_bytes_ || first > end || end > n_blocks_)
    throw runtime_error(
        fmt::format("codec: {}: decode of blocks [{}, {}) into {} bytes (stream holds {} blocks, {} bytes)",
                    what_, first, end, out.size(), n_blocks_, raw_bytes_));
  const uint64_t b0 = block_start(first);
  decode_blocks_to(first, end, out.subspan(size_t(b0), size_t(blocks_end(end) - b0)), verify);
}

void Stream::decode_blocks_to(uint32_t first, uint32_t end, std::span<std::byte> out, bool verify) const {
  if (first > end || end > n_blocks_ || out.size() != blocks_end(end) - block_start(first))
    throw runtime_error(fmt::format(
        "codec: {}: decode of blocks [{}, {}) into a window of {} bytes (stream holds {} blocks, {} bytes)",
        what_, first, end, out.size(), n_blocks_, raw_bytes_));
  const uint64_t n_values = raw_bytes_ / 2, b0 = block_start(first);
  std::vector<uint16_t> tmp;
  for (uint32_t b = first; b < end; ++b) {
    const uint64_t v0 = uint64_t(b) * block_values_;
    const size_t n = size_t(std::min<uint64_t>(block_values_, n_values - v0));
    // Decoding straight into `out` needs 2-byte alignment for uint16_t stores.
    std::byte* dst = out.data() + (v0 * 2 - b0);
    const bool aligned = reinterpret_cast<uintptr_t>(dst) % alignof(uint16_t) == 0;
    if (!aligned) tmp.resize(n);
    decode_block(b, aligned ? reinterpret_cast<uint16_t*>(dst) : tmp.data(), verify);
    if (!aligned) std::memcpy(dst, tmp.data(), n * 2);
  }
  if (has_tail_ && end == n_blocks_) out.back() = tail_;
}

void Stream::decode_values(uint64_t first, uint64_t count, uint16_t* out) const {
  const uint64_t n_values = raw_bytes_ / 2;
  if (first > n_values || count > n_values - first)
    throw runtime_error(
        fmt::format("codec: {}: decode of values [{}, {}) of {}", what_, first, first + count, n_values));
  thread_local std::vector<uint16_t> tmp;
  const uint64_t end = first + count;
  for (uint64_t v = first; v < end;) {
    const uint32_t b = uint32_t(v / block_values_);
    const uint64_t b0 = uint64_t(b) * block_values_, b1 = std::min(b0 + block_values_, n_values);
    const uint64_t stop = std::min(b1, end);
    if (v == b0 && stop == b1) {  // the whole block: straight into out
      decode_block(b, out + (v - first), false);
    } else {  // a block cut by the range: decode it whole, keep the part asked for
      if (tmp.size() < block_values_) tmp.resize(block_values_);
      decode_block(b, tmp.data(), false);
      std::memcpy(out + (v - first), tmp.data() + (v - b0), size_t(stop - v) * 2);
    }
    v = stop;
  }
}

bool Stream::exp3_blocks(uint64_t first, uint64_t count, std::vector<kernels::Exp3Block>& out) const {
  out.clear();
  const uint64_t n_values = raw_bytes_ / 2;
  if (codec_ != Codec::exp3 || first > n_values || count > n_values - first) return false;
  if (count == 0) return true;
  const uint32_t b0 = uint32_t(first / block_values_), b1 = uint32_t((first + count - 1) / block_values_);
  for (uint32_t b = b0; b <= b1; ++b) {
    const std::byte* entry = bytes_.data() + kHeaderBytes + size_t(b) * kIndexEntryBytes;
    const uint64_t start = b ? rd_u64(entry - kIndexEntryBytes) : 0, stop = rd_u64(entry);
    const std::byte* blk = bytes_.data() + data_off_ + start;
    const size_t size = size_t(stop - start);
    kernels::Exp3Block v;
    v.first = uint64_t(b) * block_values_;
    const size_t n = size_t(std::min<uint64_t>(block_values_, n_values - v.first));
    v.n = uint32_t(n);
    if (size >= 2 && std::to_integer<uint8_t>(blk[1]) == kRawBlockKind) {
      if (size != kRawBlockHead + 2 * n || blk[0] != std::byte{0} || blk[2] != std::byte{0} ||
          blk[3] != std::byte{0})
        return false;
      v.raw = reinterpret_cast<const uint8_t*>(blk + kRawBlockHead);
    } else if (!detail::exp3_view_block(blk, size, n, v)) {
      return false;
    }
    out.push_back(v);
  }
  return true;
}

std::vector<std::byte> decode(std::span<const std::byte> stream, std::string what) {
  const Stream s = Stream::parse(stream, std::move(what));
  std::vector<std::byte> out(size_t(s.raw_bytes()));
  s.decode(out, true);
  return out;
}

void reseal(std::span<std::byte> s) {
  if (s.size() < kHeaderBytes) return;
  const uint32_t n_blocks = rd_u32(s.data() + 16);
  const uint64_t index_end = kHeaderBytes + uint64_t(n_blocks) * kIndexEntryBytes;
  if (index_end > s.size()) return;
  uint64_t prev = 0;
  for (uint32_t b = 0; b < n_blocks; ++b) {
    std::byte* entry = s.data() + kHeaderBytes + size_t(b) * kIndexEntryBytes;
    const uint64_t end = rd_u64(entry);
    if (end >= prev && end <= s.size() - index_end)
      wr_u64(entry + 8, check_hash(s.subspan(size_t(index_end + prev), size_t(end - prev))));
    prev = std::max(prev, end);
  }
  wr_u64(s.data() + 32, header_check(s, n_blocks));
}

}  // namespace k3::io::codec
