#include <bit>
#include <cstring>

#include "io/codec/codec.hpp"

namespace k3::io::codec {

namespace {
constexpr uint64_t P1 = 0x9E3779B185EBCA87ull, P2 = 0xC2B2AE3D27D4EB4Full, P3 = 0x165667B19E3779F9ull;
inline uint64_t rd64(const std::byte* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}
inline uint64_t mix(uint64_t acc, uint64_t in) {
  return std::rotl(acc + in * P2, 31) * P1;
}
}  // namespace

// Not XXH64 (the codec library stands below io/ and needs only error detection, not a format
// anyone else reads): XXH64's lane round over 32-byte stripes, a simpler tail and finaliser.
uint64_t check_hash(std::span<const std::byte> bytes, uint64_t seed) {
  const std::byte* p = bytes.data();
  size_t n = bytes.size();
  uint64_t a = seed + P1, b = seed + P2, c = seed, d = seed - P1;
  for (; n >= 32; p += 32, n -= 32) {
    a = mix(a, rd64(p));
    b = mix(b, rd64(p + 8));
    c = mix(c, rd64(p + 16));
    d = mix(d, rd64(p + 24));
  }
  uint64_t h = std::rotl(a, 1) + std::rotl(b, 7) + std::rotl(c, 12) + std::rotl(d, 18) + bytes.size() * P3;
  for (; n >= 8; p += 8, n -= 8) h = std::rotl(h ^ mix(0, rd64(p)), 27) * P1 + P3;
  for (; n > 0; ++p, --n) h = std::rotl(h ^ (uint64_t(std::to_integer<uint8_t>(*p)) * P3), 11) * P1;
  h ^= h >> 33;
  h *= P2;
  h ^= h >> 29;
  h *= P3;
  h ^= h >> 32;
  return h;
}

}  // namespace k3::io::codec
