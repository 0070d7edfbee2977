// exp4: per block a base exponent and a 4-bit offset per value; offsets 0..14 code base..base+14,
// 15 marks an escape whose exponent is listed after the block (position u16, exponent u8).
#include <fmt/format.h>

#include <array>
#include <atomic>
#include <cstring>

#include "io/codec/blocks.hpp"
#include "io/codec/codec.hpp"

namespace k3::io::codec {

namespace {
std::atomic<uint64_t> g_exp4_runs[3];
}

std::vector<kernels::Isa> built_exp4_isas() {
  return {kernels::Isa::scalar, kernels::Isa::avx2, kernels::Isa::avx512};
}
uint64_t exp4_body_runs(kernels::Isa isa) {
  return g_exp4_runs[static_cast<int>(isa)].load(std::memory_order_relaxed);
}

}  // namespace k3::io::codec

namespace k3::io::codec::detail {

namespace {
constexpr int kExp4Span = 15;          // offsets 0..14
constexpr uint8_t kExp4MaxBase = 241;  // base + 14 <= 255
constexpr size_t kExp4BlockHead = 4;
}  // namespace

void exp4_encode_block(const uint16_t* v, size_t n, std::vector<std::byte>& out) {
  std::array<uint32_t, 256> hist{};
  for (size_t i = 0; i < n; ++i) ++hist[bf16_exp(v[i])];
  // The window of 15 exponents holding the most values (the lowest such base on ties).
  uint32_t win = 0;
  for (int e = 0; e < kExp4Span; ++e) win += hist[size_t(e)];
  uint32_t best = win;
  int base = 0;
  for (int b = 1; b <= kExp4MaxBase; ++b) {
    win += hist[size_t(b + kExp4Span - 1)] - hist[size_t(b - 1)];
    if (win > best) best = win, base = b;
  }
  const size_t n_esc = n - best;
  const size_t at = out.size();
  out.resize(at + kExp4BlockHead + n + (n + 1) / 2 + 3 * n_esc);
  auto* p = reinterpret_cast<uint8_t*>(out.data() + at);
  p[0] = uint8_t(base);
  p[1] = 0;
  p[2] = uint8_t(n_esc & 0xFF);
  p[3] = uint8_t(n_esc >> 8);
  uint8_t* sm = p + kExp4BlockHead;
  uint8_t* nib = sm + n;
  uint8_t* esc_pos = nib + (n + 1) / 2;
  uint8_t* esc_exp = esc_pos + 2 * n_esc;
  std::memset(nib, 0, (n + 1) / 2);
  size_t k = 0;
  for (size_t i = 0; i < n; ++i) {
    sm[i] = bf16_sm(v[i]);
    const int e = bf16_exp(v[i]);
    int off = e - base;
    if (off < 0 || off >= kExp4Span) {
      off = 15;
      esc_pos[2 * k] = uint8_t(i & 0xFF);
      esc_pos[2 * k + 1] = uint8_t(i >> 8);
      esc_exp[k] = uint8_t(e);
      ++k;
    }
    nib[i / 2] |= uint8_t(off << ((i & 1) * 4));
  }
}

void exp4_combine_scalar(const uint8_t* sm, const uint8_t* nib, uint8_t base, size_t n, uint16_t* out) {
  for (size_t i = 0; i < n; ++i) {
    const uint8_t off = (nib[i / 2] >> ((i & 1) * 4)) & 0x0F;
    out[i] = bf16_join(sm[i], uint8_t(base + off));
  }
}

void exp4_decode_block(const std::byte* blk, size_t size, size_t n, uint16_t* out) {
  const auto* p = reinterpret_cast<const uint8_t*>(blk);
  if (size < kExp4BlockHead)
    throw BlockFault{fmt::format("block of {} bytes has no room for its header", size), 0};
  const uint8_t base = p[0];
  if (base > kExp4MaxBase) throw BlockFault{fmt::format("base exponent {} > {}", base, kExp4MaxBase), 0};
  if (p[1] != 0) throw BlockFault{"reserved byte is not 0", 1};
  const size_t n_esc = size_t(p[2]) | (size_t(p[3]) << 8);
  const size_t want = kExp4BlockHead + n + (n + 1) / 2 + 3 * n_esc;
  if (n_esc > n || want != size)
    throw BlockFault{fmt::format("escape count {} does not fit: {} values need {} bytes, the block has {}",
                                 n_esc, n, want, size),
                     2};
  const uint8_t* sm = p + kExp4BlockHead;
  const uint8_t* nib = sm + n;
  const uint8_t* esc_pos = nib + (n + 1) / 2;
  const uint8_t* esc_exp = esc_pos + 2 * n_esc;
  if ((n & 1) && (nib[n / 2] >> 4) != 0) throw BlockFault{"padding nibble is not 0", size_t(nib + n / 2 - p)};

  switch (kernels::active_isa()) {
    case kernels::Isa::avx512:
      exp4_combine_avx512(sm, nib, base, n, out);
      g_exp4_runs[2].fetch_add(1, std::memory_order_relaxed);
      break;
    case kernels::Isa::avx2:
      exp4_combine_avx2(sm, nib, base, n, out);
      g_exp4_runs[1].fetch_add(1, std::memory_order_relaxed);
      break;
    case kernels::Isa::scalar:
      exp4_combine_scalar(sm, nib, base, n, out);
      g_exp4_runs[0].fetch_add(1, std::memory_order_relaxed);
      break;
  }
  size_t prev = 0;
  for (size_t k = 0; k < n_esc; ++k) {
    const size_t pos = size_t(esc_pos[2 * k]) | (size_t(esc_pos[2 * k + 1]) << 8);
    const size_t at = size_t(esc_pos + 2 * k - p);
    if (pos >= n || (k > 0 && pos <= prev))
      throw BlockFault{
          fmt::format("escape {} at value {}: not below {} and after the previous one", k, pos, n), at};
    if (((nib[pos / 2] >> ((pos & 1) * 4)) & 0x0F) != 15)
      throw BlockFault{fmt::format("escape {} at value {}: its offset is not 15", k, pos), at};
    const int e = esc_exp[k];
    if (e >= base && e < base + kExp4Span)
      throw BlockFault{fmt::format("escape {}: exponent {} lies inside the block's window", k, e),
                       size_t(esc_exp + k - p)};
    out[pos] = static_cast<uint16_t>((out[pos] & 0x807F) | (e << 7));
    prev = pos;
  }
}

}  // namespace k3::io::codec::detail
