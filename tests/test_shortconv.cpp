#include <doctest/doctest.h>

#include <cmath>
#include <vector>

#include "kernels/shortconv.hpp"
#include "tests/fixture_json.hpp"

using namespace k3::kernels;
using k3::test::Fixture;

TEST_CASE("shortconv matches fixtures/ops/shortconv.json, including the carried state") {
  const Fixture f("ops/shortconv.json");
  const auto tol = k3::test::manifest_tolerance();
  const size_t K = f.count("kernel");
  const size_t C = f.count("channels");
  const auto w = f.tensor("weight");  // [C,1,K] = flat [channel][tap]
  const auto in = f.tensor("in");     // [1,T,C]
  const auto want = f.tensor("out");
  const auto state_after = f.tensor("state_after");  // [1,C,K-1]
  const auto in_next = f.tensor("in_next");
  const auto out_next = f.tensor("out_next");
  REQUIRE(w.numel() == C * K);
  const size_t T = in.numel() / C;

  std::vector<float> hist(C * (K - 1), 0.0f);  // zero initial state
  std::vector<float> got(T * C);
  for (size_t t = 0; t < T; ++t) {
    shortconv_step(std::span<const float>(in.data).subspan(t * C, C), w.data, K, hist,
                   std::span<float>(got).subspan(t * C, C));
  }
  auto c = k3::test::compare(got, want.data, tol);
  INFO("out: " << c.str());
  CHECK(c.ok());
  c = k3::test::compare(hist, state_after.data, tol);
  INFO("state: " << c.str());
  CHECK(c.ok());

  // The read side of the state: one more step from the carried history.
  std::vector<float> next(C);
  shortconv_step(in_next.data, w.data, K, hist, next);
  c = k3::test::compare(next, out_next.data, tol);
  INFO("out_next: " << c.str());
  CHECK(c.ok());
}

TEST_CASE("shortconv arithmetic: current tap first, then history oldest first, raw inputs carried") {
  const size_t K = 4, C = 2;
  const std::vector<float> w{0.3f, -1.7f, 2.1f, 0.9f, 1.1f, 0.25f, -0.6f, 1.5f};
  std::vector<float> hist{0.5f, -0.25f, 3.0f, 1.0f, 2.0f, -4.0f};
  const std::vector<float> x{0.7f, -1.3f};
  std::vector<float> y(C);
  const std::vector<float> old = hist;
  shortconv_step(x, w, K, hist, y);
  for (size_t c = 0; c < C; ++c) {
    float acc = w[c * K + 3] * x[c];
    for (size_t j = 0; j < 3; ++j) acc = acc + w[c * K + j] * old[c * 3 + j];
    CHECK(y[c] == acc * (1.0f / (1.0f + ::expf(-acc))));
    CHECK(hist[c * 3 + 0] == old[c * 3 + 1]);
    CHECK(hist[c * 3 + 1] == old[c * 3 + 2]);
    CHECK(hist[c * 3 + 2] == x[c]);
  }
}
