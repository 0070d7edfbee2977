// XXH64 (what trunk.json's per-layer and per-shard-header checksums are), one-shot and streaming.
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <span>

namespace k3::io {

// XXH64 (seed 0 unless given), streaming. Matches the reference xxHash XXH64 output.
class Xxh64 {
 public:
  explicit Xxh64(uint64_t seed = 0);
  void update(std::span<const std::byte> bytes);
  uint64_t digest() const;

 private:
  uint64_t v_[4];
  uint64_t seed_;
  uint64_t total_ = 0;
  std::array<std::byte, 32> buf_{};
  size_t buffered_ = 0;
};
uint64_t xxh64(std::span<const std::byte> bytes, uint64_t seed = 0);

}  // namespace k3::io
