// The ordinary vocabulary: a tiktoken rank file (`base64(token bytes) SP rank` per line) held as one
// byte arena plus an open-addressing hash from byte strings to ranks. Rank = token id.
#pragma once
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "io/aligned.hpp"

namespace k3::io::text {

class Vocab {
 public:
  // Throws io::Error (runtime, "FILE:LINE: reason") for: a line that is not `base64 SP rank`, bad
  // base64, a rank that is not a decimal number below 2^31, ranks that are not exactly 0..N-1 for
  // N lines (a repeated rank, or one >= N), repeated token bytes, an empty token, an empty file, and
  // a vocabulary missing one of the 256 single bytes (rank BPE starts from them). Blank lines are
  // skipped, as tiktoken's own loader does; a trailing CR is ignored.
  static Vocab load(const std::filesystem::path& path);

  int32_t size() const { return int32_t(spans_.size()); }

  std::string_view bytes(int32_t rank) const {
    const Span s = spans_[size_t(rank)];
    return {arena_.data() + s.off, s.len};
  }

  // The rank of exactly these bytes, or -1. Most lookups (BPE pairs, short words) are of at most 8
  // bytes, which the slot holds itself, so they read one slot and nothing else.
  int32_t find(const char* p, size_t n) const {
    if (n == 2) return pairs_[(uint8_t(p[0]) << 8) | uint8_t(p[1])];
    const uint64_t h = hash(p, n);
    if (!maybe_present(h)) return -1;
    const uint32_t tag = slot_tag(h, n);
    const uint64_t head = load_head(p, n);
    for (size_t i = h & mask_;; i = (i + 1) & mask_) {
      const Slot& s = slots_[i];
      if (s.tag == tag && s.head == head) {
        if (n <= 8) return int32_t(s.rank);
        const Span sp = spans_[s.rank];
        if (sp.len == n && std::memcmp(arena_.data() + sp.off + 8, p + 8, n - 8) == 0) return int32_t(s.rank);
      } else if (s.tag == 0) {
        return -1;
      }
    }
  }
  int32_t find(std::string_view b) const { return find(b.data(), b.size()); }

  // The rank of a single byte; every vocabulary has all 256 (checked at load).
  int32_t byte_rank(unsigned char b) const { return byte_ranks_[b]; }

  static uint64_t hash(const char* p, size_t n) {
    uint64_t h = 0x9E3779B97F4A7C15ull ^ (n * 0xFF51AFD7ED558CCDull);
    while (n >= 8) {
      uint64_t w;
      std::memcpy(&w, p, 8);
      h = (h ^ w) * 0xBF58476D1CE4E5B9ull;
      h ^= h >> 29;
      p += 8;
      n -= 8;
    }
    if (n > 0) {
      uint64_t w = 0;
      if (n >= 4) {
        uint32_t a, b;
        std::memcpy(&a, p, 4);
        std::memcpy(&b, p + n - 4, 4);
        w = (uint64_t(a) << 32) | b;
      } else {
        w = (uint64_t(uint8_t(p[0])) << 16) | (uint64_t(uint8_t(p[n >> 1])) << 8) | uint8_t(p[n - 1]);
      }
      h = (h ^ w) * 0x94D049BB133111EBull;
    }
    h ^= h >> 32;
    h *= 0xD6E8FEB86659FD93ull;
    h ^= h >> 32;
    return h;
  }

 private:
  struct Span {
    uint32_t off, len;
  };
  struct Slot {
    uint32_t tag;  // 24 hash bits and the length (capped at 255), never 0 for a token; 0 = empty
    uint32_t rank;
    uint64_t head;  // the first min(len, 8) bytes, zero-padded
  };
  // A blocked Bloom filter over all tokens (two bits in one 64-bit word per token, 256 KiB, a few
  // per cent false positives): most failed lookups, which BPE makes for every pair that does not
  // merge, end in this cache-resident array instead of a cache miss in the slot table.
  static constexpr size_t kFilterWords = size_t(1) << 15;
  static uint64_t filter_bits(uint64_t h) { return (uint64_t(1) << (h & 63)) | (uint64_t(1) << (h >> 58)); }
  bool maybe_present(uint64_t h) const {
    const uint64_t bits = filter_bits(h);
    return (filter_[(h >> 6) & (kFilterWords - 1)] & bits) == bits;
  }
  static uint32_t slot_tag(uint64_t h, size_t n) {
    return uint32_t(h >> 40) << 8 | uint32_t(n < 255 ? n : 255);
  }
  static uint64_t load_head(const char* p, size_t n) {
    uint64_t w = 0;
    std::memcpy(&w, p, n < 8 ? n : 8);
    return w;
  }

  std::string arena_;  // every token's bytes, back to back, in file order
  std::vector<Span> spans_;
  io::AlignedBuffer slot_memory_;  // zero-filled = all slots empty; huge pages when large
  const Slot* slots_ = nullptr;
  size_t mask_ = 0;
  int32_t byte_ranks_[256] = {};
  std::vector<uint64_t> filter_;
  std::vector<int32_t> pairs_;  // the rank of every two-byte string (-1: not a token), 256 KiB
};

}  // namespace k3::io::text
