#include <doctest/doctest.h>
#include <tbb/global_control.h>
#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/dispatch.hpp"
#include "kernels/kda.hpp"
#include "tests/fixture_json.hpp"
#include "tests/isa_bodies.hpp"

using namespace k3::kernels;
using k3::test::Fixture;

TEST_CASE("kda_decay matches fixtures/ops/kda_decay.json within an ABSOLUTE 1e-5") {
  const Fixture f("ops/kda_decay.json");
  const float lb = static_cast<float>(f.number("lower_bound"));
  const auto z = f.tensor("z");  // [1,T,P], before dt_bias
  const auto a_log = f.tensor("A_log");
  const auto dt_bias = f.tensor("dt_bias");
  const auto want_g = f.tensor("g");  // [1,T,H,D]
  const auto want_a = f.tensor("alpha");
  const size_t H = want_g.shape[2], D = want_g.shape[3], P = H * D, T = want_g.shape[1];
  REQUIRE(z.numel() == T * P);
  std::vector<float> g(T * P), alpha(T * P);
  for (size_t t = 0; t < T; ++t) {
    kda_decay(std::span<const float>(z.data).subspan(t * P, P), a_log.data, dt_bias.data, H, D, lb,
              std::span<float>(g).subspan(t * P, P), std::span<float>(alpha).subspan(t * P, P));
  }
  auto c = k3::test::compare_abs(g, want_g.data, 1e-5);
  INFO("g: " << c.str());
  CHECK(c.ok());
  c = k3::test::compare_abs(alpha, want_a.data, 1e-5);
  INFO("alpha: " << c.str());
  CHECK(c.ok());
  float lo = alpha[0], hi = alpha[0];
  for (float a : alpha) {
    lo = std::min(lo, a);
    hi = std::max(hi, a);
  }
  CHECK(std::fabs(lo - f.number("alpha_min")) <= 1e-5);
  CHECK(std::fabs(hi - f.number("alpha_max")) <= 1e-5);
  // g may be omitted when only alpha is wanted.
  std::vector<float> alpha_only(P);
  kda_decay(std::span<const float>(z.data).first(P), a_log.data, dt_bias.data, H, D, lb, {}, alpha_only);
  CHECK(std::memcmp(alpha_only.data(), alpha.data(), P * sizeof(float)) == 0);
}

namespace {

void check_recurrence(const char* file) {
  const Fixture f(file);
  const auto tol = k3::test::manifest_tolerance();
  const size_t T = f.count("T"), H = f.count("H"), D = f.count("d_k");
  REQUIRE(f.count("d_v") == D);
  const float q_scale = static_cast<float>(f.number("q_scale"));
  CHECK(q_scale == kda_q_scale(D));
  const auto q = f.tensor("q"), k = f.tensor("k"), v = f.tensor("v"), alpha = f.tensor("alpha");
  const auto beta = f.tensor("beta");
  const auto want = f.tensor("out"), want_state = f.tensor("state_out");

  for (Isa isa : supported_isas()) {
    const std::string isa_s = isa_name(isa);
    CAPTURE(isa_s);
    set_active_isa(isa);
    std::vector<float> S(H * D * D, 0.0f), out(T * H * D), qs(D);
    for (size_t t = 0; t < T; ++t) {
      for (size_t h = 0; h < H; ++h) {
        const size_t off = (t * H + h) * D;
        for (size_t i = 0; i < D; ++i) qs[i] = q.data[off + i] * q_scale;
        const std::span<const float> kk(k.data.data() + off, D), vv(v.data.data() + off, D),
            aa(alpha.data.data() + off, D);
        kda_step(std::span<float>(S).subspan(h * D * D, D * D), aa, kk, vv, beta.data[t * H + h], qs,
                 std::span<float>(out).subspan(off, D), D);
      }
    }
    auto c = k3::test::compare(out, want.data, tol);
    INFO("out: " << c.str());
    CHECK(c.ok());
    c = k3::test::compare(S, want_state.data, tol);
    INFO("state: " << c.str());
    CHECK(c.ok());
  }
  set_active_isa(supported_isas().back());
}

}  // namespace

TEST_CASE("kda recurrence matches fixtures/ops/kda_recur1.json") {
  const k3::test::BodyCheck bodies{Kernel::kda_step};
  check_recurrence("ops/kda_recur1.json");
  bodies.check();
}
TEST_CASE("kda recurrence matches fixtures/ops/kda_recur8.json") {
  const k3::test::BodyCheck bodies{Kernel::kda_step};
  check_recurrence("ops/kda_recur8.json");
  bodies.check();
}

namespace {

// docs/model.md §5.2 KDA step, written out independently: all f32, no fusion, zero k_i / q_i rows skipped.
void reference_step(std::vector<float>& S, const std::vector<float>& alpha, const std::vector<float>& k,
                    const std::vector<float>& v, float beta, const std::vector<float>& q,
                    std::vector<float>& o, size_t D) {
  for (size_t i = 0; i < D; ++i) {
    for (size_t j = 0; j < D; ++j) S[i * D + j] = S[i * D + j] * alpha[i];
  }
  std::vector<float> u(D, 0.0f);
  for (size_t j = 0; j < D; ++j) {
    for (size_t i = 0; i < D; ++i) {
      if (k[i] == 0.0f) continue;
      u[j] = u[j] + k[i] * S[i * D + j];
    }
  }
  for (size_t i = 0; i < D; ++i) {
    if (k[i] == 0.0f) continue;
    for (size_t j = 0; j < D; ++j) S[i * D + j] = S[i * D + j] + (k[i] * beta) * (v[j] - u[j]);
  }
  o.assign(D, 0.0f);
  for (size_t j = 0; j < D; ++j) {
    for (size_t i = 0; i < D; ++i) {
      if (q[i] == 0.0f) continue;
      o[j] = o[j] + q[i] * S[i * D + j];
    }
  }
}

uint32_t xorshift(uint32_t& s) {
  s ^= s << 13;
  s ^= s >> 17;
  s ^= s << 5;
  return s;
}

float uniform(uint32_t& s) {
  return static_cast<float>(xorshift(s) >> 8) / 8388608.0f - 1.0f;
}

}  // namespace

TEST_CASE("kda_step: every body equals the reference bit for bit, zero k/q rows (incl. -0.0) skipped") {
  const k3::test::BodyCheck bodies{Kernel::kda_step};
  uint32_t seed = 0x5EED;
  for (size_t D : {1, 7, 15, 16, 17, 33, 128}) {
    CAPTURE(D);
    std::vector<float> S0(D * D), alpha(D), k(D), v(D), q(D);
    for (auto& x : S0) x = uniform(seed) * 4.0f;
    for (auto& x : alpha) x = 0.5f + 0.5f * std::fabs(uniform(seed));
    for (auto& x : k) x = uniform(seed);
    for (auto& x : v) x = uniform(seed) * 3.0f;
    for (auto& x : q) x = uniform(seed) * 0.25f;
    // Zero rows of both signs. A state row holding inf shows the skip: 0 * inf would be NaN.
    k[0] = -0.0f;
    q[0] = 0.0f;
    if (D > 2) {
      k[D / 2] = 0.0f;
      q[D - 1] = -0.0f;
      S0[(D / 2) * D] = INFINITY;
      q[D / 2] = 0.0f;
    }
    S0[0] = INFINITY;
    const float beta = 0.375f;
    std::vector<float> Sr = S0, orf;
    reference_step(Sr, alpha, k, v, beta, q, orf, D);
    for (size_t j = 0; j < D; ++j) CHECK(!std::isnan(orf[j]));
    for (Isa isa : supported_isas()) {
      const std::string isa_s = isa_name(isa);
      CAPTURE(isa_s);
      set_active_isa(isa);
      std::vector<float> S = S0, o(D);
      kda_step(S, alpha, k, v, beta, q, o, D);
      CHECK(std::memcmp(S.data(), Sr.data(), S.size() * sizeof(float)) == 0);
      CHECK(std::memcmp(o.data(), orf.data(), D * sizeof(float)) == 0);
    }
  }
  set_active_isa(supported_isas().back());
  bodies.check();
}

// The bodies once kept u and o in stack arrays of 256 floats, so a larger head_dim wrote past them;
// they now run the value channels in strips of at most 256 (kda_bodies.hpp). Sizes below, at and
// across strip boundaries (with vector tails), several heads in parallel as stages/kda.cpp runs
// them, two steps; `o` starts as NaN so a column left unwritten shows.
TEST_CASE("kda_step at any head_dim: every body and thread count equals the reference bit for bit") {
  const k3::test::BodyCheck bodies{Kernel::kda_step};
  static tbb::global_control allow(tbb::global_control::max_allowed_parallelism, 8);
  constexpr size_t H = 3, T = 2;
  uint32_t seed = 0xD1CE;
  for (size_t D : {64, 72, 128, 200, 256, 257, 320, 511, 512, 1024}) {
    CAPTURE(D);
    const size_t P = H * D;
    std::vector<float> S0(H * D * D), alpha(T * P), k(T * P), v(T * P), q(T * P), beta(T * H);
    for (auto& x : S0) x = uniform(seed) * 4.0f;
    for (auto& x : alpha) x = 0.5f + 0.5f * std::fabs(uniform(seed));
    for (auto& x : k) x = uniform(seed) * 0.1f;
    for (auto& x : v) x = uniform(seed) * 3.0f;
    for (auto& x : q) x = uniform(seed) * 0.05f;
    for (auto& x : beta) x = std::fabs(uniform(seed));
    for (size_t r = 0; r < T * H; ++r) {  // zero rows of both signs, past 256 where D allows
      k[r * D + D / 3] = -0.0f;
      k[r * D + D - 1] = 0.0f;
      q[r * D + D / 2] = 0.0f;
      q[r * D + (D * 3) / 4] = -0.0f;
    }

    std::vector<float> Sr = S0, want_o(T * P);
    for (size_t h = 0; h < H; ++h) {
      std::vector<float> Sh(Sr.begin() + h * D * D, Sr.begin() + (h + 1) * D * D), oh;
      for (size_t t = 0; t < T; ++t) {
        const size_t at = t * P + h * D;
        auto slice = [&](const std::vector<float>& a) {
          return std::vector<float>(a.begin() + at, a.begin() + at + D);
        };
        reference_step(Sh, slice(alpha), slice(k), slice(v), beta[t * H + h], slice(q), oh, D);
        std::copy(oh.begin(), oh.end(), want_o.begin() + at);
      }
      std::copy(Sh.begin(), Sh.end(), Sr.begin() + h * D * D);
    }
    REQUIRE(std::all_of(want_o.begin(), want_o.end(), [](float x) { return std::isfinite(x); }));

    for (Isa isa : supported_isas()) {
      set_active_isa(isa);
      for (int threads : {1, 2}) {
        const std::string isa_s = isa_name(isa);
        CAPTURE(isa_s);
        CAPTURE(threads);
        std::vector<float> S = S0, o(T * P, NAN);
        tbb::task_arena arena(threads);
        arena.execute([&] {
          tbb::parallel_for(size_t{0}, H, [&](size_t h) {
            for (size_t t = 0; t < T; ++t) {
              const size_t at = t * P + h * D;
              const auto in = [&](const std::vector<float>& a) {
                return std::span<const float>(a).subspan(at, D);
              };
              kda_step(std::span<float>(S).subspan(h * D * D, D * D), in(alpha), in(k), in(v),
                       beta[t * H + h], in(q), std::span<float>(o).subspan(at, D), D);
            }
          });
        });
        CHECK(std::memcmp(S.data(), Sr.data(), S.size() * sizeof(float)) == 0);
        CHECK(std::memcmp(o.data(), want_o.data(), o.size() * sizeof(float)) == 0);
      }
    }
  }
  set_active_isa(supported_isas().back());
  bodies.check();
}

TEST_CASE("kda_decay arithmetic and kda_q_scale") {
  const std::vector<float> z{-30.0f, 0.0f, 0.5f, 25.0f, -100.0f, 3.0f};
  const std::vector<float> a_log{0.2f, -0.4f, 9.0f};  // third value unused: per head, H = 2
  const std::vector<float> dt{0.1f, -0.2f, 0.3f, 0.0f, 1.0f, -1.0f};
  std::vector<float> g(6), alpha(6);
  kda_decay(z, a_log, dt, 2, 3, -5.0f, g, alpha);
  for (size_t i = 0; i < 6; ++i) {
    const float a = ::expf(a_log[i / 3]);
    const float u = a * (z[i] + dt[i]);
    const float gi = -5.0f * (1.0f / (1.0f + ::expf(-u)));
    CHECK(g[i] == gi);
    CHECK(alpha[i] == ::expf(gi));
  }
  CHECK(kda_q_scale(128) == 1.0f / ::sqrtf(128.0f));
  CHECK(kda_q_scale(16) == 0.25f);
}
