#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/attnres.hpp"
#include "tests/fixture_json.hpp"

using namespace k3::kernels;
using k3::test::Fixture;

TEST_CASE("attnres matches fixtures/ops/attnres.json (8 blocks then the prefix; fold_hint)") {
  const Fixture f("ops/attnres.json");
  const auto tol = k3::test::manifest_tolerance();
  const float eps = static_cast<float>(f.number("eps"));
  const auto prefix = f.tensor("prefix_sum");      // [T][E]
  const auto blocks = f.tensor("block_residual");  // [T][nb][E]
  const auto fold_hint = f.tensor("fold_hint");
  const auto want = f.tensor("out");
  const size_t T = prefix.shape[0], nb = blocks.shape[1], E = prefix.shape[1];
  REQUIRE(nb + 1 == f.count("n_sources"));

  std::vector<float> fold(E);
  attnres_fold(f.tensor("norm_weight").data, f.tensor("proj_weight").data, fold);
  const auto cf = k3::test::compare(fold, fold_hint.data, tol);
  INFO("fold: " << cf.str());
  CHECK(cf.ok());

  std::vector<float> got(T * E), scores(nb + 1);
  for (size_t t = 0; t < T; ++t) {
    std::vector<std::span<const float>> src;
    for (size_t b = 0; b < nb; ++b)
      src.push_back(std::span<const float>(blocks.data).subspan((t * nb + b) * E, E));
    src.push_back(prefix.row(t));
    attnres(src, fold_hint.data, eps, scores, std::span<float>(got).subspan(t * E, E));
  }
  const auto c = k3::test::compare(got, want.data, tol);
  INFO(c.str());
  CHECK(c.ok());
}

TEST_CASE("attnres arithmetic equals a reference written from docs/model.md §5.2") {
  const size_t E = 19, n = 3;
  std::vector<std::vector<float>> v(n, std::vector<float>(E));
  std::vector<float> fold(E);
  for (size_t s = 0; s < n; ++s) {
    for (size_t i = 0; i < E; ++i) v[s][i] = std::sin(static_cast<float>(s * 31 + i)) * (1.0f + s);
  }
  for (size_t i = 0; i < E; ++i) fold[i] = std::cos(static_cast<float>(i)) * 0.7f;
  const float eps = 1e-5f;
  std::vector<float> sc(n);
  for (size_t s = 0; s < n; ++s) {
    double ss = 0.0;
    for (float x : v[s]) ss = ss + static_cast<double>(x) * static_cast<double>(x);
    const float inv =
        static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(E) + static_cast<double>(eps)));
    double acc = 0.0;
    for (size_t i = 0; i < E; ++i)
      acc = acc + static_cast<double>(v[s][i] * inv) * static_cast<double>(fold[i]);
    sc[s] = static_cast<float>(acc);
  }
  float m = sc[0];
  for (size_t s = 1; s < n; ++s) m = sc[s] > m ? sc[s] : m;
  std::vector<float> e(n), p(n);
  double z = 0.0;
  for (size_t s = 0; s < n; ++s) {
    e[s] = ::expf(sc[s] - m);
    z = z + static_cast<double>(e[s]);
  }
  for (size_t s = 0; s < n; ++s) p[s] = static_cast<float>(static_cast<double>(e[s]) / z);
  std::vector<float> want(E, 0.0f);
  for (size_t s = 0; s < n; ++s) {
    for (size_t i = 0; i < E; ++i) want[i] = want[i] + p[s] * v[s][i];
  }
  std::vector<std::span<const float>> src(v.begin(), v.end());
  std::vector<float> got(E), scores(n);
  attnres(src, fold, eps, scores, got);
  CHECK(std::memcmp(got.data(), want.data(), E * sizeof(float)) == 0);
}
