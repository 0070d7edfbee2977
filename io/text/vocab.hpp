// The ordinary vocabulary: a tiktoken rank file (`base64(token bytes) SP rank` per line) held as one
// byte arena plus an open-addressing hash from byte strings to ranks. Rank = token id.
#pragma once
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

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

  // The rank of exactly these bytes, or -1.
  int32_t find(const char* p, size_t n) const {
    const uint64_t h = hash(p, n);
    const uint32_t tag = uint32_t(h >> 32) | 1;  // never 0, which marks an empty slot
    for (size_t i = h & mask_;; i = (i + 1) & mask_) {
      const Slot s = slots_[i];
      if (s.tag == 0) return -1;
      if (s.tag == tag) {
        const Span sp = spans_[s.rank];
        if (sp.len == n && std::memcmp(arena_.data() + sp.off, p, n) == 0) return int32_t(s.rank);
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
    uint32_t tag;  // upper hash bits | 1; 0 = empty
    uint32_t rank;
  };

  std::string arena_;  // every token's bytes, back to back, in file order
  std::vector<Span> spans_;
  std::vector<Slot> slots_;
  size_t mask_ = 0;
  int32_t byte_ranks_[256] = {};
};

}  // namespace k3::io::text
