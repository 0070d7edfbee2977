#include <doctest/doctest.h>

#include <cmath>
#include <vector>

#include "kernels/norms.hpp"
#include "tests/fixture_json.hpp"

using namespace k3::kernels;
using k3::test::Fixture;

TEST_CASE("rmsnorm matches fixtures/ops/rmsnorm.json") {
  const Fixture f("ops/rmsnorm.json");
  const auto tol = k3::test::manifest_tolerance();
  const float eps = static_cast<float>(f.number("eps"));
  const auto w = f.tensor("weight");
  const auto in = f.tensor("in");
  const auto want = f.tensor("out");
  REQUIRE(in.shape.size() == 2);
  std::vector<float> got(in.numel());
  for (size_t r = 0; r < in.shape[0]; ++r) {
    std::span<float> y(got.data() + r * in.shape[1], in.shape[1]);
    rmsnorm(in.row(r), w.data, eps, y);
  }
  const auto c = k3::test::compare(got, want.data, tol);
  INFO(c.str());
  CHECK(c.ok());

  // In place gives the same bits: the inverse is computed before anything is written.
  std::vector<float> inplace = in.data;
  for (size_t r = 0; r < in.shape[0]; ++r) {
    rmsnorm_inplace(std::span<float>(inplace.data() + r * in.shape[1], in.shape[1]), w.data, eps);
  }
  CHECK(inplace == got);
}

TEST_CASE("rmsnorm arithmetic: sequential f64 sum, f32 eps widened, (w*x)*inv") {
  std::vector<float> x(37), w(37), y(37);
  for (size_t i = 0; i < x.size(); ++i) {
    x[i] = std::ldexp(static_cast<float>(i * 7919 % 101) - 50.0f, -3);
    w[i] = 1.0f + static_cast<float>(i) / 64.0f;
  }
  double ss = 0.0;
  for (float v : x) ss += static_cast<double>(v) * v;
  const float inv = static_cast<float>(1.0 / std::sqrt(ss / 37.0 + static_cast<double>(1e-5f)));
  CHECK(rms_inverse(x, 1e-5f) == inv);
  rmsnorm(x, w, 1e-5f, y);
  for (size_t i = 0; i < x.size(); ++i) CHECK(y[i] == (w[i] * x[i]) * inv);
}

TEST_CASE("l2norm uses the sum of squares, not the mean") {
  std::vector<float> x{3.0f, 4.0f, 0.0f, 0.0f};
  l2norm_inplace(x);
  CHECK(x[0] == doctest::Approx(0.6f).epsilon(1e-6));
  CHECK(x[1] == doctest::Approx(0.8f).epsilon(1e-6));
  CHECK(x[2] == 0.0f);
  const float inv = static_cast<float>(1.0 / std::sqrt(25.0 + static_cast<double>(1e-6f)));
  CHECK(x[0] == 3.0f * inv);
}
