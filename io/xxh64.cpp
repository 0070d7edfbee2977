// XXH64, written from the xxHash specification (the 32-byte stripes of four lanes, the 8/4/1-byte
// tail, the avalanche), streaming so a layer can be hashed as it is written or read.
#include "io/xxh64.hpp"

#include <algorithm>
#include <bit>
#include <cstring>

namespace k3::io {

namespace {

constexpr uint64_t P1 = 0x9E3779B185EBCA87ull, P2 = 0xC2B2AE3D27D4EB4Full, P3 = 0x165667B19E3779F9ull,
                   P4 = 0x85EBCA77C2B2AE63ull, P5 = 0x27D4EB2F165667C5ull;

uint64_t rd64(const std::byte* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;  // x86-64 is little-endian, as XXH64 reads
}
uint32_t rd32(const std::byte* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
uint64_t round64(uint64_t acc, uint64_t in) {
  return std::rotl(acc + in * P2, 31) * P1;
}
uint64_t merge64(uint64_t h, uint64_t v) {
  return (h ^ round64(0, v)) * P1 + P4;
}

}  // namespace

Xxh64::Xxh64(uint64_t seed) : v_{seed + P1 + P2, seed + P2, seed, seed - P1}, seed_(seed) {}

void Xxh64::update(std::span<const std::byte> in) {
  if (in.empty()) return;  // an empty span's data() may be null, which memcpy must not be given
  const std::byte* p = in.data();
  size_t n = in.size();
  total_ += n;
  if (buffered_) {
    size_t take = std::min(n, 32 - buffered_);
    std::memcpy(buf_.data() + buffered_, p, take);
    buffered_ += take;
    p += take;
    n -= take;
    if (buffered_ < 32) return;
    for (int i = 0; i < 4; ++i) v_[i] = round64(v_[i], rd64(buf_.data() + 8 * i));
    buffered_ = 0;
  }
  uint64_t v0 = v_[0], v1 = v_[1], v2 = v_[2], v3 = v_[3];
  for (; n >= 32; p += 32, n -= 32) {
    v0 = round64(v0, rd64(p));
    v1 = round64(v1, rd64(p + 8));
    v2 = round64(v2, rd64(p + 16));
    v3 = round64(v3, rd64(p + 24));
  }
  v_[0] = v0, v_[1] = v1, v_[2] = v2, v_[3] = v3;
  std::memcpy(buf_.data(), p, n);
  buffered_ = n;
}

uint64_t Xxh64::digest() const {
  uint64_t h;
  if (total_ >= 32) {
    h = std::rotl(v_[0], 1) + std::rotl(v_[1], 7) + std::rotl(v_[2], 12) + std::rotl(v_[3], 18);
    for (uint64_t v : v_) h = merge64(h, v);
  } else {
    h = seed_ + P5;
  }
  h += total_;
  const std::byte* p = buf_.data();
  size_t n = buffered_;
  for (; n >= 8; p += 8, n -= 8) h = std::rotl(h ^ round64(0, rd64(p)), 27) * P1 + P4;
  if (n >= 4) {
    h = std::rotl(h ^ (uint64_t(rd32(p)) * P1), 23) * P2 + P3;
    p += 4, n -= 4;
  }
  for (; n > 0; ++p, --n) h = std::rotl(h ^ (uint64_t(std::to_integer<uint8_t>(*p)) * P5), 11) * P1;
  h ^= h >> 33;
  h *= P2;
  h ^= h >> 29;
  h *= P3;
  h ^= h >> 32;
  return h;
}

uint64_t xxh64(std::span<const std::byte> bytes, uint64_t seed) {
  Xxh64 h(seed);
  h.update(bytes);
  return h.digest();
}

}  // namespace k3::io
