#include <doctest/doctest.h>

#include <cmath>
#include <vector>

#include "kernels/attention.hpp"

using namespace k3::kernels;

TEST_CASE("mla_score: one sequential f64 sum through nope then rope, rounded, then scaled") {
  std::vector<float> qn(24), kn(24), qr(8), kr(8);
  for (size_t i = 0; i < 24; ++i) {
    qn[i] = std::sin(static_cast<float>(i) * 1.3f);
    kn[i] = std::cos(static_cast<float>(i) * 0.7f) * 3.0f;
  }
  for (size_t i = 0; i < 8; ++i) {
    qr[i] = 1e8f * static_cast<float>(i % 2 ? 1 : -1);
    kr[i] = 1e-8f * static_cast<float>(i + 1);
  }
  double d = 0.0;
  for (size_t i = 0; i < 24; ++i) d = d + static_cast<double>(qn[i]) * static_cast<double>(kn[i]);
  for (size_t i = 0; i < 8; ++i) d = d + static_cast<double>(qr[i]) * static_cast<double>(kr[i]);
  const float scale = 1.0f / ::sqrtf(192.0f);
  CHECK(mla_score(qn, kn, qr, kr, scale) == static_cast<float>(d) * scale);
}

TEST_CASE("softmax: f32 exps, sequential f64 normaliser, both seeds") {
  const std::vector<float> s{-1.5f, 3.25f, 0.0f, 3.25f, -80.0f};
  std::vector<float> p(s.size()), want(s.size());
  const float m = 3.25f;
  double z = 0.0;
  std::vector<float> e(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    e[i] = ::expf(s[i] - m);
    z = z + static_cast<double>(e[i]);
  }
  for (size_t i = 0; i < s.size(); ++i) want[i] = static_cast<float>(static_cast<double>(e[i]) / z);
  softmax(s, p, SoftmaxSeed::neg_inf);
  CHECK(p == want);
  softmax(s, p, SoftmaxSeed::first);
  CHECK(p == want);
  // In place is allowed (AttnRes turns its scores into probabilities).
  std::vector<float> q = s;
  softmax(q, q, SoftmaxSeed::first);
  CHECK(q == want);
}
