// exp3: per block a base exponent and a 3-bit code per value; codes 0..6 stand for base..base+6,
// code 7 marks an escape whose exponent byte is listed after the block, in value order (no
// positions: the decoder finds them as the values whose three code bits are all set).
//
// The codes are stored in bit planes, 64 values a group: three u64 words per group, word k holding
// bit k of each of the group's 64 codes (value j of the group in bit j). A group's escapes are
// then plane0 & plane1 & plane2, and the SIMD bodies expand the planes straight into byte lanes
// (AVX-512BW: the words are the lane masks themselves).
#include <fmt/format.h>

#include <array>
#include <atomic>
#include <bit>
#include <cstring>

#include "io/codec/blocks.hpp"
#include "io/codec/codec.hpp"

namespace k3::io::codec {

namespace {
std::atomic<uint64_t> g_exp3_runs[3];
}

std::vector<kernels::Isa> built_exp3_isas() {
  return {kernels::Isa::scalar, kernels::Isa::avx2, kernels::Isa::avx512};
}
uint64_t exp3_body_runs(kernels::Isa isa) {
  return g_exp3_runs[static_cast<int>(isa)].load(std::memory_order_relaxed);
}

}  // namespace k3::io::codec

namespace k3::io::codec::detail {

namespace {
constexpr int kExp3Span = 7;           // codes 0..6
constexpr uint8_t kEscape = 7;         // code 7: the exponent is in the escape list
constexpr uint8_t kExp3MaxBase = 249;  // base + 6 <= 255
constexpr size_t kExp3BlockHead = 4;

uint64_t rd_u64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}
void wr_u64(uint8_t* p, uint64_t v) {
  std::memcpy(p, &v, 8);
}
}  // namespace

size_t exp3_code_bytes(size_t n) {
  return (n + kExp3Group - 1) / kExp3Group * kExp3GroupBytes;
}

void exp3_encode_block(const uint16_t* v, size_t n, std::vector<std::byte>& out) {
  std::array<uint32_t, 256> hist{};
  for (size_t i = 0; i < n; ++i) ++hist[bf16_exp(v[i])];
  // The window of 7 exponents holding the most values (the lowest such base on ties).
  uint32_t win = 0;
  for (int e = 0; e < kExp3Span; ++e) win += hist[size_t(e)];
  uint32_t best = win;
  int base = 0;
  for (int b = 1; b <= kExp3MaxBase; ++b) {
    win += hist[size_t(b + kExp3Span - 1)] - hist[size_t(b - 1)];
    if (win > best) best = win, base = b;
  }
  const size_t n_esc = n - best;
  const size_t at = out.size();
  out.resize(at + kExp3BlockHead + n + exp3_code_bytes(n) + n_esc);
  auto* p = reinterpret_cast<uint8_t*>(out.data() + at);
  p[0] = uint8_t(base);
  p[1] = 0;
  p[2] = uint8_t(n_esc & 0xFF);
  p[3] = uint8_t(n_esc >> 8);
  uint8_t* sm = p + kExp3BlockHead;
  uint8_t* codes = sm + n;
  uint8_t* esc = codes + exp3_code_bytes(n);
  size_t k = 0;
  for (size_t g = 0; g * kExp3Group < n; ++g) {
    uint64_t plane[3] = {0, 0, 0};
    for (size_t j = 0; j < kExp3Group && g * kExp3Group + j < n; ++j) {
      const size_t i = g * kExp3Group + j;
      sm[i] = bf16_sm(v[i]);
      const int e = bf16_exp(v[i]);
      int code = e - base;
      if (code < 0 || code >= kExp3Span) {
        code = kEscape;
        esc[k++] = uint8_t(e);
      }
      for (int b = 0; b < 3; ++b) plane[b] |= uint64_t((code >> b) & 1) << j;
    }
    for (int b = 0; b < 3; ++b) wr_u64(codes + g * kExp3GroupBytes + 8 * size_t(b), plane[b]);
  }
}

void exp3_combine_scalar(const uint8_t* sm, const uint8_t* codes, uint8_t base, size_t n, uint16_t* out) {
  for (size_t g = 0; g * kExp3Group < n; ++g) {
    const uint8_t* c = codes + g * kExp3GroupBytes;
    const uint64_t p0 = rd_u64(c), p1 = rd_u64(c + 8), p2 = rd_u64(c + 16);
    const size_t i0 = g * kExp3Group, m = std::min(kExp3Group, n - i0);
    for (size_t j = 0; j < m; ++j) {
      const auto code = uint8_t(((p0 >> j) & 1) | (((p1 >> j) & 1) << 1) | (((p2 >> j) & 1) << 2));
      out[i0 + j] = bf16_join(sm[i0 + j], uint8_t(base + code));
    }
  }
}

bool exp3_view_block(const std::byte* blk, size_t size, size_t n, kernels::Exp3Block& v) {
  const auto* p = reinterpret_cast<const uint8_t*>(blk);
  if (size < kExp3BlockHead || p[0] > kExp3MaxBase || p[1] != 0) return false;
  const size_t n_esc = size_t(p[2]) | (size_t(p[3]) << 8);
  if (n_esc > n || kExp3BlockHead + n + exp3_code_bytes(n) + n_esc != size) return false;
  v.n_esc = uint32_t(n_esc);
  v.base = p[0];
  v.sm = p + kExp3BlockHead;
  v.planes = v.sm + n;
  v.esc = v.planes + exp3_code_bytes(n);
  v.raw = nullptr;
  return true;
}

void exp3_decode_block(const std::byte* blk, size_t size, size_t n, uint16_t* out) {
  const auto* p = reinterpret_cast<const uint8_t*>(blk);
  if (size < kExp3BlockHead)
    throw BlockFault{fmt::format("block of {} bytes has no room for its header", size), 0};
  const uint8_t base = p[0];
  if (base > kExp3MaxBase) throw BlockFault{fmt::format("base exponent {} > {}", base, kExp3MaxBase), 0};
  if (p[1] != 0) throw BlockFault{"reserved byte is not 0", 1};
  const size_t n_esc = size_t(p[2]) | (size_t(p[3]) << 8);
  const size_t want = kExp3BlockHead + n + exp3_code_bytes(n) + n_esc;
  if (n_esc > n || want != size)
    throw BlockFault{fmt::format("escape count {} does not fit: {} values need {} bytes, the block has {}",
                                 n_esc, n, want, size),
                     2};
  const uint8_t* sm = p + kExp3BlockHead;
  const uint8_t* codes = sm + n;
  const uint8_t* esc = codes + exp3_code_bytes(n);
  const size_t groups = (n + kExp3Group - 1) / kExp3Group;
  if (const size_t tail = n % kExp3Group; tail != 0) {  // the last group's unused code bits are 0
    const uint8_t* c = codes + (groups - 1) * kExp3GroupBytes;
    const uint64_t unused = ~uint64_t{0} << tail;
    for (size_t b = 0; b < 3; ++b)
      if (rd_u64(c + 8 * b) & unused) throw BlockFault{"padding code bits are not 0", size_t(c + 8 * b - p)};
  }

  switch (kernels::active_isa()) {
    case kernels::Isa::avx512:
      exp3_combine_avx512(sm, codes, base, n, out);
      g_exp3_runs[2].fetch_add(1, std::memory_order_relaxed);
      break;
    case kernels::Isa::avx2:
      exp3_combine_avx2(sm, codes, base, n, out);
      g_exp3_runs[1].fetch_add(1, std::memory_order_relaxed);
      break;
    case kernels::Isa::scalar:
      exp3_combine_scalar(sm, codes, base, n, out);
      g_exp3_runs[0].fetch_add(1, std::memory_order_relaxed);
      break;
  }
  // The escapes, in value order: the values whose three code bits are set.
  size_t k = 0;
  for (size_t g = 0; g < groups; ++g) {
    const uint8_t* c = codes + g * kExp3GroupBytes;
    for (uint64_t m = rd_u64(c) & rd_u64(c + 8) & rd_u64(c + 16); m != 0; m &= m - 1, ++k) {
      const size_t pos = g * kExp3Group + size_t(std::countr_zero(m));
      if (k >= n_esc)
        throw BlockFault{fmt::format("value {} is escape {}, past the escape count {}", pos, k, n_esc), 2};
      const int e = esc[k];
      if (e >= base && e < base + kExp3Span)
        throw BlockFault{fmt::format("escape {}: exponent {} lies inside the block's window", k, e),
                         size_t(esc + k - p)};
      out[pos] = static_cast<uint16_t>((out[pos] & 0x807F) | (e << 7));
    }
  }
  if (k != n_esc)
    throw BlockFault{fmt::format("escape count {}, but {} values are coded as escapes", n_esc, k), 2};
}

}  // namespace k3::io::codec::detail
