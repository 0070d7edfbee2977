// io/codec: arbitrary bytes as a codec stream. Byte 0 picks the path: bit 0 verifies the checks,
// bit 1 reseals the checks first (so structural validation behind them is reached). An accepted
// stream must decode to exactly raw_bytes() on every exp4 / exp3 body alike, and two halves of the block
// range decoded separately must give the same bytes as one pass.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "io/codec/codec.hpp"
#include "kernels/dispatch.hpp"
#include "tests/fuzz/fuzz_common.hpp"

namespace codec = k3::io::codec;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const uint8_t mode = data[0];
  std::vector<std::byte> s(size - 1);
  if (!s.empty()) std::memcpy(s.data(), data + 1, s.size());
  if (mode & 2) codec::reseal(s);
  const bool verify = mode & 1;
  k3::fuzz::accepts([&] {
    const codec::Stream st = codec::Stream::parse(s, "fuzz", 0, verify);
    if (st.raw_bytes() > (uint64_t(64) << 20)) return;  // a header may claim more than we allocate
    std::vector<std::byte> want(size_t(st.raw_bytes()));
    k3::kernels::set_active_isa(k3::kernels::Isa::scalar);
    st.decode(want, verify);
    for (k3::kernels::Isa isa : k3::kernels::supported_isas()) {
      k3::kernels::set_active_isa(isa);
      std::vector<std::byte> got(want.size(), std::byte{0x5A});
      const uint32_t mid = st.n_blocks() / 2;
      st.decode_blocks(0, mid, got, verify);
      st.decode_blocks(mid, st.n_blocks(), got, verify);
      K3_FUZZ_CHECK(got == want, "every body and every split decode the same bytes");
    }
  });
  return 0;
}
