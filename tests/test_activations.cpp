#include <doctest/doctest.h>

#include <cmath>
#include <vector>

#include "kernels/activations.hpp"
#include "tests/fixture_json.hpp"

using namespace k3::kernels;
using k3::test::Fixture;

TEST_CASE("situ_glu matches fixtures/ops/situ_glu.json and stays within b1*b2") {
  const Fixture f("ops/situ_glu.json");
  const auto tol = k3::test::manifest_tolerance();
  const float b1 = static_cast<float>(f.number("beta"));
  const float b2 = static_cast<float>(f.number("linear_beta"));
  const double max_abs = f.number("max_abs");
  const auto in = f.tensor("in");
  const auto want = f.tensor("out");
  REQUIRE(in.shape.size() == 2);
  const size_t n = in.shape[1] / 2;  // a row is [gate(n) | up(n)]
  std::vector<float> got(in.shape[0] * n);
  for (size_t r = 0; r < in.shape[0]; ++r) {
    const auto row = in.row(r);
    situ_glu(row.first(n), row.subspan(n, n), b1, b2, std::span<float>(got.data() + r * n, n));
  }
  const auto c = k3::test::compare(got, want.data, tol);
  INFO(c.str());
  CHECK(c.ok());
  for (float y : got) CHECK(std::fabs(y) <= b1 * b2 + 1e-2);
  CHECK(b1 * b2 == doctest::Approx(max_abs));
}

TEST_CASE("situ_glu arithmetic: divide by beta, sigmoid of the raw gate") {
  const std::vector<float> g{-30.0f, -1.25f, 0.0f, 0.3f, 7.0f, 1000.0f};
  const std::vector<float> u{2.0f, -100.0f, 5.0f, 0.1f, 40.0f, -3.0f};
  std::vector<float> y(g.size());
  situ_glu(g, u, 4.0f, 25.0f, y);
  for (size_t i = 0; i < g.size(); ++i) {
    const float s = 1.0f / (1.0f + ::expf(-g[i]));
    const float a = (4.0f * ::tanhf(g[i] / 4.0f)) * s;
    CHECK(y[i] == a * (25.0f * ::tanhf(u[i] / 25.0f)));
  }
}

TEST_CASE("sigmoid, silu, gate, axpy and add are the plain f32 operations") {
  CHECK(sigmoid(0.0f) == 0.5f);
  CHECK(sigmoid(-100.0f) == 1.0f / (1.0f + ::expf(100.0f)));
  CHECK(silu(2.0f) == 2.0f * (1.0f / (1.0f + ::expf(-2.0f))));
  std::vector<float> x{1.0f, -2.0f, 3.0f}, gg{0.5f, -0.5f, 9.0f};
  std::vector<float> want(3);
  for (size_t i = 0; i < 3; ++i) want[i] = x[i] * (1.0f / (1.0f + ::expf(-gg[i])));
  sigmoid_gate_inplace(x, gg);
  CHECK(x == want);
  // f32 multiply rounded, then f32 add: never a fused multiply-add.
  std::vector<float> out{1.0f, 1.0f}, v{1.0f + 0x1p-23f, 3.0f};
  const float p = 1.0f + 0x1p-23f;
  axpy(p, v, out);
  volatile float prod = p * v[0];
  CHECK(out[0] == 1.0f + prod);
  add_inplace(out, v);
  CHECK(out[1] == (1.0f + p * 3.0f) + 3.0f);
}

TEST_CASE("weighted_sum: from +0, in order, f32 multiply then f32 add") {
  const std::vector<float> a{1.0f, -2.0f, 0x1p-30f}, b{3.0f, 0.5f, 1.0f}, c{-1.0f, 1e30f, -0.0f};
  const std::vector<std::span<const float>> v{a, b, c};
  const std::vector<float> w{0.3f, 1.0f + 0x1p-23f, 0.7f};
  std::vector<float> out(3, 42.0f), want(3, 0.0f);
  for (size_t j = 0; j < 3; ++j) {
    for (size_t i = 0; i < 3; ++i) want[i] = want[i] + w[j] * v[j][i];
  }
  weighted_sum(w, v, out);
  CHECK(out == want);
  // No sources: +0 everywhere.
  weighted_sum({}, {}, out);
  for (float o : out) CHECK(!std::signbit(o));
}
