// huff: per block a canonical Huffman code over the exponent byte (lengths 1..12, MSB-first bits),
// sign+mantissa bytes raw. Decode looks 12 bits up in a 4096-entry table built per block.
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <queue>

#include "io/codec/blocks.hpp"

namespace k3::io::codec::detail {

namespace {

constexpr int kMaxLen = 12;
constexpr size_t kHuffBlockHead = 8;

// Huffman code lengths for the nonzero frequencies (a single symbol gets length 1); when the
// longest exceeds kMaxLen the frequencies are halved (rounding up) and the code rebuilt.
std::array<uint8_t, 256> code_lengths(std::array<uint64_t, 256> freq) {
  for (;;) {
    std::array<uint8_t, 256> len{};
    struct Node {
      uint64_t w;
      int id;
    };
    auto cmp = [](const Node& a, const Node& b) { return a.w != b.w ? a.w > b.w : a.id > b.id; };
    std::priority_queue<Node, std::vector<Node>, decltype(cmp)> q(cmp);
    std::vector<int> parent(512, -1);
    int next = 256, n_sym = 0;
    for (int s = 0; s < 256; ++s)
      if (freq[size_t(s)]) q.push({freq[size_t(s)], s}), ++n_sym;
    if (n_sym == 1) {
      for (int s = 0; s < 256; ++s)
        if (freq[size_t(s)]) len[size_t(s)] = 1;
      return len;
    }
    while (q.size() > 1) {
      Node a = q.top();
      q.pop();
      Node b = q.top();
      q.pop();
      parent[size_t(a.id)] = parent[size_t(b.id)] = next;
      q.push({a.w + b.w, next++});
    }
    int longest = 0;
    for (int s = 0; s < 256; ++s) {
      if (!freq[size_t(s)]) continue;
      int d = 0;
      for (int x = s; parent[size_t(x)] >= 0; x = parent[size_t(x)]) ++d;
      len[size_t(s)] = uint8_t(std::min(d, 255));
      longest = std::max(longest, d);
    }
    if (longest <= kMaxLen) return len;
    for (auto& f : freq)
      if (f) f = (f + 1) / 2;
  }
}

// Canonical codes: by (length, symbol), consecutive.
struct Code {
  uint16_t code = 0;
  uint8_t len = 0;
};
std::array<Code, 256> canonical(const uint8_t* syms, const uint8_t* lens, int n_sym) {
  std::vector<int> order(static_cast<size_t>(n_sym));
  for (int i = 0; i < n_sym; ++i) order[size_t(i)] = i;
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return lens[a] < lens[b]; });
  std::array<Code, 256> out{};
  uint32_t code = 0;
  int prev_len = 0;
  for (int i : order) {
    code <<= (lens[i] - prev_len);
    prev_len = lens[i];
    out[syms[i]] = {uint16_t(code), lens[i]};
    ++code;
  }
  return out;
}

}  // namespace

void huff_encode_block(const uint16_t* v, size_t n, std::vector<std::byte>& out) {
  std::array<uint64_t, 256> freq{};
  for (size_t i = 0; i < n; ++i) ++freq[bf16_exp(v[i])];
  const std::array<uint8_t, 256> len = code_lengths(freq);
  uint8_t syms[256], lens[256];
  int n_sym = 0;
  uint64_t bits = 0;
  for (int s = 0; s < 256; ++s)
    if (len[size_t(s)])
      syms[n_sym] = uint8_t(s), lens[n_sym] = len[size_t(s)], ++n_sym,
      bits += freq[size_t(s)] * len[size_t(s)];
  const std::array<Code, 256> codes = canonical(syms, lens, n_sym);
  const size_t bits_bytes = size_t((bits + 7) / 8);
  const size_t at = out.size();
  out.resize(at + kHuffBlockHead + 2 * size_t(n_sym) + n + bits_bytes);
  auto* p = reinterpret_cast<uint8_t*>(out.data() + at);
  p[0] = uint8_t(n_sym - 1);
  p[1] = p[2] = p[3] = 0;
  const uint32_t bb = uint32_t(bits_bytes);
  std::memcpy(p + 4, &bb, 4);
  uint8_t* q = p + kHuffBlockHead;
  for (int i = 0; i < n_sym; ++i) *q++ = syms[i], *q++ = lens[i];
  for (size_t i = 0; i < n; ++i) *q++ = bf16_sm(v[i]);
  uint64_t acc = 0;
  int fill = 0;
  for (size_t i = 0; i < n; ++i) {
    const Code c = codes[bf16_exp(v[i])];
    acc = (acc << c.len) | c.code;
    fill += c.len;
    while (fill >= 8) *q++ = uint8_t(acc >> (fill -= 8));
  }
  if (fill > 0) *q++ = uint8_t(acc << (8 - fill));
}

void huff_decode_block(const std::byte* blk, size_t size, size_t n, uint16_t* out) {
  const auto* p = reinterpret_cast<const uint8_t*>(blk);
  if (size < kHuffBlockHead)
    throw BlockFault{fmt::format("block of {} bytes has no room for its header", size), 0};
  const int n_sym = p[0] + 1;
  if (p[1] || p[2] || p[3]) throw BlockFault{"reserved bytes are not 0", 1};
  uint32_t bits_bytes;
  std::memcpy(&bits_bytes, p + 4, 4);
  const size_t want = kHuffBlockHead + 2 * size_t(n_sym) + n + size_t(bits_bytes);
  if (want != size)
    throw BlockFault{fmt::format("{} symbols, {} values and {} code bytes need {} bytes, the block has {}",
                                 n_sym, n, bits_bytes, want, size),
                     4};
  const uint8_t* table = p + kHuffBlockHead;
  uint8_t syms[256], lens[256];
  uint32_t kraft = 0;
  for (int i = 0; i < n_sym; ++i) {
    syms[i] = table[2 * i], lens[i] = table[2 * i + 1];
    const size_t at = kHuffBlockHead + 2 * size_t(i);
    if (i > 0 && syms[i] <= syms[i - 1]) throw BlockFault{"code table symbols are not increasing", at};
    if (lens[i] < 1 || lens[i] > kMaxLen)
      throw BlockFault{fmt::format("code length {} outside 1..{}", lens[i], kMaxLen), at + 1};
    kraft += 1u << (kMaxLen - lens[i]);
  }
  const bool single = n_sym == 1;
  if (single ? lens[0] != 1 : kraft != (1u << kMaxLen))
    throw BlockFault{"code table is not a complete prefix code", kHuffBlockHead};
  const std::array<Code, 256> codes = canonical(syms, lens, n_sym);
  // lut[12 bits] = symbol | length << 8; 0 = no code (only with a single symbol).
  std::array<uint16_t, 1u << kMaxLen> lut{};
  for (int i = 0; i < n_sym; ++i) {
    const Code c = codes[syms[i]];
    const uint32_t lo = uint32_t(c.code) << (kMaxLen - c.len), hi = uint32_t(c.code + 1) << (kMaxLen - c.len);
    for (uint32_t k = lo; k < hi; ++k) lut[k] = uint16_t(syms[i] | (c.len << 8));
  }
  const uint8_t* sm = table + 2 * n_sym;
  const uint8_t* bits = sm + n;
  const size_t bits_at = size_t(bits - p);
  auto fail_at = [&](uint64_t bitpos, const char* what) {
    return BlockFault{fmt::format("{} at code bit {}", what, bitpos), bits_at + size_t(bitpos / 8)};
  };
  // The fast loop reads 8 bytes at a time; it stops 8 bytes before the end, the rest goes through
  // a zero-padded copy, so no read leaves the block.
  uint64_t pos = 0;
  const uint64_t end_bits = uint64_t(bits_bytes) * 8;
  size_t i = 0;
  auto load_be = [](const uint8_t* q) {
    uint64_t w;
    std::memcpy(&w, q, 8);
    return __builtin_bswap64(w);
  };
  while (i + 4 <= n && (pos >> 3) + 8 <= bits_bytes) {
    uint64_t w = load_be(bits + (pos >> 3)) << (pos & 7);  // >= 57 valid bits: 4 codes of <= 12
    for (int k = 0; k < 4; ++k) {
      const uint16_t e = lut[w >> (64 - kMaxLen)];
      const int l = e >> 8;
      if (l == 0) throw fail_at(pos, "no code");
      out[i] = bf16_join(sm[i], uint8_t(e));
      ++i;
      w <<= l;
      pos += uint64_t(l);
    }
  }
  uint8_t tail[24] = {};
  const size_t tail_from = size_t(std::min<uint64_t>(pos >> 3, bits_bytes));
  std::memcpy(tail, bits + tail_from, std::min<size_t>(bits_bytes - tail_from, 16));
  for (; i < n; ++i) {
    if (pos > end_bits) throw fail_at(pos, "code bits run past the block");
    const size_t byte = size_t(pos >> 3) - tail_from;
    if (byte + 8 > sizeof tail) throw fail_at(pos, "code window overrun");  // pos <= end_bits keeps it inside
    const uint64_t w = load_be(tail + byte) << (pos & 7);
    const uint16_t e = lut[w >> (64 - kMaxLen)];
    const int l = e >> 8;
    if (l == 0) throw fail_at(pos, "no code");
    out[i] = bf16_join(sm[i], uint8_t(e));
    pos += uint64_t(l);
  }
  if (pos > end_bits) throw fail_at(pos, "code bits run past the block");
  if ((pos + 7) / 8 != bits_bytes) throw fail_at(pos, "code bytes left over after the last value");
  if (pos & 7) {
    const uint8_t last = bits[bits_bytes - 1];
    if (uint8_t(last << (pos & 7)) != 0) throw fail_at(pos, "padding bits are not 0");
  }
}

}  // namespace k3::io::codec::detail
