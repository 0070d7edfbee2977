// Deterministic value generation for synthetic tensors: xoshiro256+ streams keyed by
// (seed, tensor name, 1 MiB chunk), so bytes never depend on threads, buffers or shard packing.
#include <bit>
#include <cstring>
#include <string_view>

#include "io/synth/synth.hpp"

namespace k3::io::synth {

namespace {

uint64_t splitmix64(uint64_t& x) {
  uint64_t z = (x += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

uint64_t fnv1a(std::string_view s) {
  uint64_t h = 0xCBF29CE484222325ull;
  for (char c : s) h = (h ^ static_cast<unsigned char>(c)) * 0x100000001B3ull;
  return h;
}

class Xoshiro256 {
 public:
  explicit Xoshiro256(uint64_t seed) {
    for (uint64_t& w : s_) w = splitmix64(seed);
  }
  uint64_t next() {
    const uint64_t r = s_[0] + s_[3];
    const uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = std::rotl(s_[3], 45);
    return r;
  }

 private:
  uint64_t s_[4];
};

inline float unit_uniform(uint64_t r) {
  return static_cast<float>(r >> 40) * (1.0f / 16777216.0f);
}

inline uint16_t to_bf16(float f) {  // round to nearest even; inputs are always finite
  uint32_t b = std::bit_cast<uint32_t>(f);
  b += 0x7FFFu + ((b >> 16) & 1u);
  return static_cast<uint16_t>(b >> 16);
}

// Two unit-variance, zero-mean approximate normals from one draw: each the sum of four uniform
// bytes (Irwin-Hall, n=4), bounded at ±3.45 so no value is ever extreme. Summed in SWAR lanes.
constexpr float kByteSumMean = 510.0f, kByteSumInvSd = 1.0f / 147.80f;
inline void normal_pair(uint64_t r, float& a, float& b) {
  constexpr uint64_t kBytes = 0x00FF00FF00FF00FFull, kPairs = 0x0000FFFF0000FFFFull;
  const uint64_t p = (r & kBytes) + ((r >> 8) & kBytes);
  const uint64_t q = (p & kPairs) + ((p >> 16) & kPairs);
  a = (static_cast<float>(static_cast<int32_t>(q & 0xFFFF)) - kByteSumMean) * kByteSumInvSd;
  b = (static_cast<float>(static_cast<int32_t>(q >> 32)) - kByteSumMean) * kByteSumInvSd;
}

// Bytes one generator draw produces for a tensor.
size_t draw_bytes(const SynthTensor& t) {
  switch (t.fill) {
    case Fill::mxfp4_packed:
    case Fill::mxfp4_scale:
      return 8;
    case Fill::normal:
    case Fill::gain:
      return 2 * io::dtype_size(t.entry.dtype);  // two values per draw
    default:
      return io::dtype_size(t.entry.dtype);
  }
}

// One draw's bytes, for draw index `unit` of the tensor.
inline void draw(const SynthTensor& t, uint64_t r, uint64_t unit, std::byte* dst) {
  switch (t.fill) {
    case Fill::none:
      std::memset(dst, 0, draw_bytes(t));
      return;
    case Fill::normal:
    case Fill::gain: {
      const float base = t.fill == Fill::gain ? 1.0f : 0.0f;
      float v[2];
      normal_pair(r, v[0], v[1]);
      for (int i = 0; i < 2; ++i) {
        const float x = base + t.scale * v[i];
        if (t.entry.dtype == io::DType::F32) {
          std::memcpy(dst + 4 * i, &x, 4);
        } else {
          const uint16_t h = to_bf16(x);
          std::memcpy(dst + 2 * i, &h, 2);
        }
      }
      return;
    }
    case Fill::a_log: {
      const float v = unit < static_cast<uint64_t>(t.valid) ? -0.5f + 1.5f * unit_uniform(r) : 0.0f;
      std::memcpy(dst, &v, 4);
      return;
    }
    case Fill::mxfp4_packed:
      std::memcpy(dst, &r, 8);
      return;
    case Fill::mxfp4_scale:
      // center-1, center or center+1: (byte * 3) >> 8 maps a uniform byte onto 0..2.
      for (int i = 0; i < 8; ++i)
        dst[i] = std::byte(t.center - 1 + static_cast<int>((((r >> (8 * i)) & 0xFF) * 3) >> 8));
      return;
  }
}

// Bytes [from, to) of one chunk (offsets within the tensor; the chunk starts at `chunk_begin`).
void fill_chunk(const SynthTensor& t, Xoshiro256& rng, uint64_t chunk_begin, uint64_t from, uint64_t to,
                std::byte* out) {
  const size_t u = draw_bytes(t);
  uint64_t unit = chunk_begin / u;  // chunk starts are multiples of every draw size
  for (uint64_t p = chunk_begin; p + u <= from; p += u, ++unit) rng.next();
  uint64_t pos = from;
  if (const uint64_t head = (from - chunk_begin) % u) {
    std::byte tmp[8];
    draw(t, rng.next(), unit++, tmp);
    const uint64_t n = std::min<uint64_t>(u - head, to - pos);
    std::memcpy(out, tmp + head, n);
    out += n;
    pos += n;
  }
  // The bulk of every checkpoint: draw a batch, then transform it in a loop the compiler can vectorise.
  constexpr int kBatch = 64;
  uint64_t r[kBatch];
  if (t.fill == Fill::normal && t.entry.dtype == io::DType::BF16) {
    for (; pos + 4 * kBatch <= to; pos += 4 * kBatch, out += 4 * kBatch, unit += kBatch) {
      for (uint64_t& x : r) x = rng.next();
      uint32_t w[kBatch];
      for (int i = 0; i < kBatch; ++i) {
        float a, b;
        normal_pair(r[i], a, b);
        w[i] = uint32_t(to_bf16(t.scale * a)) | (uint32_t(to_bf16(t.scale * b)) << 16);
      }
      std::memcpy(out, w, sizeof w);
    }
  } else if (t.fill == Fill::mxfp4_packed) {
    for (; pos + 8 <= to; pos += 8, out += 8, ++unit) {
      const uint64_t x = rng.next();
      std::memcpy(out, &x, 8);
    }
  } else if (t.fill == Fill::mxfp4_scale) {
    for (; pos + 8 * kBatch <= to; pos += 8 * kBatch, out += 8 * kBatch, unit += kBatch) {
      for (uint64_t& x : r) x = rng.next();
      uint8_t b[8 * kBatch];
      std::memcpy(b, r, sizeof b);  // little-endian: byte i of draw j is b[8j + i], as in draw()
      for (uint8_t& x : b) x = static_cast<uint8_t>(t.center - 1 + ((x * 3) >> 8));
      std::memcpy(out, b, sizeof b);
    }
  }
  for (; pos + u <= to; pos += u, out += u, ++unit) draw(t, rng.next(), unit, out);
  if (pos < to) {
    std::byte tmp[8];
    draw(t, rng.next(), unit, tmp);
    std::memcpy(out, tmp, to - pos);
  }
}

}  // namespace

void fill_bytes(const SynthTensor& t, uint64_t seed, uint64_t offset, std::span<std::byte> out) {
  uint64_t key = seed;
  key = splitmix64(key) ^ fnv1a(t.entry.name);
  uint64_t pos = offset;
  const uint64_t end = offset + out.size();
  std::byte* dst = out.data();
  while (pos < end) {
    const uint64_t chunk = pos / kFillChunk, chunk_begin = chunk * kFillChunk;
    const uint64_t to = std::min(end, chunk_begin + kFillChunk);
    uint64_t chunk_key = key ^ (chunk * 0xD1B54A32D192ED03ull);
    Xoshiro256 rng(splitmix64(chunk_key));
    fill_chunk(t, rng, chunk_begin, pos, to, dst);
    dst += to - pos;
    pos = to;
  }
}

}  // namespace k3::io::synth
