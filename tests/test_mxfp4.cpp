// fixtures/mxfp4.json: real checkpoint bytes (docs/model.md §6.3). Dequantisation lives here, in the test:
// the engine never builds a dequantised copy; its matmul reads the nibbles (§5.4).
#include <doctest/doctest.h>

#include <cmath>
#include <string>
#include <vector>

#include "kernels/dispatch.hpp"
#include "kernels/matmul.hpp"
#include "kernels/mxfp4.hpp"
#include "tests/fixture_json.hpp"
#include "tests/isa_bodies.hpp"

using namespace k3::kernels;
using k3::test::Fixture;

namespace {

struct Packed {
  size_t rows, cols;
  std::vector<uint8_t> packed, scales;
};

Packed load(const Fixture& f) {
  Packed p{f.count("rows"), f.count("logical_width"), f.tensor("packed").as<uint8_t>(),
           f.tensor("scales").as<uint8_t>()};
  REQUIRE(f.count("group_size") == kMxfp4Group);
  REQUIRE(p.packed.size() == p.rows * f.count("packed_cols"));
  REQUIRE(p.scales.size() == p.rows * f.count("scale_cols"));
  REQUIRE(f.count("packed_cols") == mxfp4_packed_cols(p.cols));
  REQUIRE(f.count("scale_cols") == mxfp4_scale_cols(p.cols));
  return p;
}

// w = E2M1[nibble] * 2^(b-127) in f32; byte 255 dequantises to 0. `high_first` reverses the
// nibble order (the bug the fixture guards against).
std::vector<float> dequantise(const Packed& p, bool high_first = false) {
  std::vector<float> out(p.rows * p.cols);
  const size_t pc = mxfp4_packed_cols(p.cols), sc = mxfp4_scale_cols(p.cols);
  for (size_t r = 0; r < p.rows; ++r) {
    for (size_t i = 0; i < p.cols; ++i) {
      const uint8_t byte = p.packed[r * pc + i / 2];
      const bool high = (i % 2 == 1) != high_first;
      const uint8_t nib = high ? byte >> 4 : byte & 0xF;
      const uint8_t s = p.scales[r * sc + i / kMxfp4Group];
      out[r * p.cols + i] = s == 255 ? 0.0f : kE2m1[nib] * std::ldexp(1.0f, static_cast<int>(s) - 127);
    }
  }
  return out;
}

}  // namespace

TEST_CASE("E2M1 table and E8M0 scales") {
  const auto lut = Fixture("mxfp4.json").numbers("e2m1_lut");
  REQUIRE(lut.size() == 16);
  for (size_t i = 0; i < 16; ++i) {
    CHECK(kE2m1[i] == static_cast<float>(lut[i]));
    CHECK(std::signbit(kE2m1[i]) == (i >= 8));
  }
  CHECK(e8m0_to_f32(127) == 1.0f);
  CHECK(e8m0_to_f32(121) == 0x1p-6f);
  CHECK(e8m0_to_f32(254) == 0x1p127f);
  CHECK(std::bit_cast<uint32_t>(e8m0_to_f32(0)) == 0x00400000u);  // 2^-127, an f32 subnormal
}

TEST_CASE("dequantising fixtures/mxfp4.json reproduces all 229,376 values exactly, low nibble first") {
  const Fixture f("mxfp4.json");
  const Packed p = load(f);
  const auto want = f.tensor("expected");
  REQUIRE(want.numel() == 229376);
  const auto got = dequantise(p);
  size_t mismatches = 0;
  for (size_t i = 0; i < got.size(); ++i) mismatches += got[i] == want.data[i] ? 0 : 1;  // as values
  CHECK(mismatches == 0);
  // The spec's worked example: byte 0x16 with scale 121.
  CHECK(p.packed[0] == 0x16);
  CHECK(p.scales[0] == 121);
  CHECK(got[0] == 0.0625f);
  CHECK(got[1] == 0.0078125f);

  const auto swapped = dequantise(p, true);
  size_t differ = 0;
  for (size_t i = 0; i < got.size(); ++i) differ += swapped[i] == want.data[i] ? 0 : 1;
  CHECK(differ > 0);
  const auto first64 = f.at("expected_swapped_nibbles").at_key("first64").get_array();
  REQUIRE(!first64.error());
  size_t i = 0;
  for (auto v : first64.value_unsafe()) {
    CHECK(swapped[i] == static_cast<float>(v.get_double().value()));
    ++i;
  }
  CHECK(i == 64);
}

TEST_CASE("fused MXFP4 matvec on the checkpoint bytes equals dequantise-then-f64-dot within 1e-6") {
  const k3::test::BodyCheck bodies{Kernel::matmul};
  const Fixture f("mxfp4.json");
  const Packed p = load(f);
  const auto deq = dequantise(p);
  std::vector<float> x(p.cols);
  uint32_t s = 0xC0FFEE;
  for (auto& v : x) {
    s ^= s << 13;
    s ^= s >> 17;
    s ^= s << 5;
    v = static_cast<float>(s >> 8) / 8388608.0f - 1.0f;
  }
  const Mxfp4Matrix m{p.packed, p.scales, p.rows, p.cols};
  for (Isa isa : supported_isas()) {
    const std::string isa_s = isa_name(isa);
    CAPTURE(isa_s);
    set_active_isa(isa);
    std::vector<float> y(p.rows);
    matvec(m, x, y);
    for (size_t r = 0; r < p.rows; ++r) {
      double ref = 0.0, mag = 0.0;
      for (size_t i = 0; i < p.cols; ++i) {
        ref += static_cast<double>(deq[r * p.cols + i]) * static_cast<double>(x[i]);
        mag += std::fabs(static_cast<double>(deq[r * p.cols + i]) * static_cast<double>(x[i]));
      }
      CAPTURE(r);
      CHECK(std::isfinite(y[r]));
      // The two f64 sums differ only in order (~1e-16 of the magnitude); the f32 rounding of the
      // result is the visible difference.
      CHECK(std::fabs(static_cast<double>(y[r]) - ref) <= 1e-6 * std::fabs(ref) + 1e-12 * mag);
    }
  }
  set_active_isa(supported_isas().back());
  bodies.check();
}
