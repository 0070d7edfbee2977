#include <doctest/doctest.h>
#include <tbb/global_control.h>
#include <tbb/task_arena.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/dispatch.hpp"
#include "kernels/router.hpp"
#include "tests/fixture_json.hpp"
#include "tests/isa_bodies.hpp"

using namespace k3::kernels;
using k3::test::Fixture;

TEST_CASE("router matches fixtures/ops/router.json (index sets, weights by expert id)") {
  const Fixture f("ops/router.json");
  const auto tol = k3::test::manifest_tolerance();
  const size_t k = f.count("top_k");
  const size_t E = f.count("n_experts");
  const auto gate = f.tensor("gate_weight");
  const auto bias = f.tensor("bias");
  const auto in = f.tensor("in");
  const auto want_idx = f.tensor("topk_idx");
  const auto want_w = f.tensor("topk_weight");
  const size_t hidden = gate.shape[1];
  const F32Matrix g{gate.data, E, hidden};
  const RouterParams p{k, true, 1.0f};

  size_t changed = 0;
  for (size_t t = 0; t < in.shape[0]; ++t) {
    std::vector<float> scores(E), w(k);
    std::vector<int32_t> idx(k);
    route(g, in.row(t), bias.data, p, scores, idx, w);
    for (size_t j = 0; j < k; ++j) {
      CAPTURE(t);
      CAPTURE(j);
      CHECK(std::isfinite(w[j]));
      // The fixture's order is unsorted: match by expert id.
      size_t m = k;
      for (size_t i = 0; i < k; ++i) {
        if (static_cast<int32_t>(want_idx.row(t)[i]) == idx[j]) m = i;
      }
      REQUIRE(m < k);
      const float want = want_w.row(t)[m];
      CHECK(std::fabs(w[j] - want) <= tol.atol + tol.rtol * std::fabs(want));
    }
    std::vector<int32_t> plain(k);
    std::vector<float> pw(k);
    route(g, in.row(t), {}, p, scores, plain, pw);
    bool same = true;
    for (size_t j = 0; j < k; ++j) same = same && plain[j] == idx[j];
    changed += same ? 0 : 1;
  }
  // The fixture is built so that the bias changes the selection on most rows.
  CHECK(changed == f.count("rows_where_bias_changed_selection"));
}

namespace {

// Written from docs/model.md §5.2 independently of the kernel.
void reference_route(const std::vector<float>& W, size_t E, size_t n, const std::vector<float>& x,
                     const std::vector<float>& bias, size_t k, bool renorm, float scale,
                     std::vector<int32_t>& idx, std::vector<float>& w) {
  std::vector<float> s(E), c(E);
  for (size_t e = 0; e < E; ++e) {
    double acc = 0.0;
    for (size_t i = 0; i < n; ++i) acc = acc + static_cast<double>(W[e * n + i]) * static_cast<double>(x[i]);
    s[e] = 1.0f / (1.0f + ::expf(-static_cast<float>(acc)));
    c[e] = s[e] + (bias.empty() ? 0.0f : bias[e]);
  }
  idx.assign(k, 0);
  w.assign(k, 0.0f);
  for (size_t j = 0; j < k; ++j) {
    float best = -INFINITY;
    bool found = false;
    for (size_t e = 0; e < E; ++e) {
      if (c[e] > best) {
        best = c[e];
        idx[j] = static_cast<int32_t>(e);
        found = true;
      }
    }
    if (!found) continue;
    w[j] = s[idx[j]];
    c[idx[j]] = -INFINITY;
  }
  if (renorm && k > 1) {
    double sum = 0.0;
    for (float v : w) sum = sum + static_cast<double>(v);
    const float inv = static_cast<float>(1.0 / (sum + 1e-20));
    for (float& v : w) v = v * inv;
  }
  for (float& v : w) v = v * scale;
}

uint32_t xorshift(uint32_t& s) {
  s ^= s << 13;
  s ^= s >> 17;
  s ^= s << 5;
  return s;
}

}  // namespace

TEST_CASE("router: every body x thread count, f32 and bf16 gates of equal values, equal a reference") {
  const k3::test::BodyCheck bodies{Kernel::router};
  static tbb::global_control allow(tbb::global_control::max_allowed_parallelism, 8);
  uint32_t seed = 0xC0FFEE;
  // > 64 experts takes the parallel path; 131 = 8 blocks of 16 + 1 of 8 + 3 alone; widths with and
  // without an 8-element tail, and one shorter than a block.
  for (size_t E : {5, 64, 131}) {
    for (size_t n : {7, 64, 257}) {
      CAPTURE(E);
      CAPTURE(n);
      const size_t k = std::min<size_t>(6, E);
      std::vector<uint16_t> wb(E * n);
      std::vector<float> wf(E * n), x(n), bias(E);
      for (size_t i = 0; i < wb.size(); ++i) {
        wb[i] = static_cast<uint16_t>(xorshift(seed) >> 16);
        wb[i] &= 0xBFFF;  // exponent < 0x80: finite, |w| < 2, sigmoids unsaturated (incl. subnormals)
        wf[i] = bf16_to_f32(wb[i]);
      }
      for (auto& v : x) v = static_cast<float>(xorshift(seed) >> 8) / 8388608.0f - 1.0f;
      for (auto& v : bias) v = (static_cast<float>(xorshift(seed) >> 8) / 8388608.0f - 1.0f) * 0.1f;

      std::vector<int32_t> ri, ri_plain;
      std::vector<float> rw, rw_plain;
      reference_route(wf, E, n, x, bias, k, true, 2.5f, ri, rw);
      reference_route(wf, E, n, x, {}, k, false, 1.0f, ri_plain, rw_plain);
      const Isa saved = active_isa();
      for (Isa isa : supported_isas()) {
        set_active_isa(isa);
        for (int threads : {1, 2, 7}) {
          const std::string isa_s = isa_name(isa);
          CAPTURE(isa_s);
          CAPTURE(threads);
          tbb::task_arena arena(threads);
          for (const DenseMatrix& g : {DenseMatrix(F32Matrix{wf, E, n}), DenseMatrix(Bf16Matrix{wb, E, n})}) {
            std::vector<float> scores(E), w(k);
            std::vector<int32_t> idx(k);
            arena.execute([&] { route(g, x, bias, RouterParams{k, true, 2.5f}, scores, idx, w); });
            CHECK(idx == ri);
            CHECK(std::memcmp(w.data(), rw.data(), k * sizeof(float)) == 0);
            // No renormalisation: the raw unbiased sigmoids times the scale.
            arena.execute([&] { route(g, x, {}, RouterParams{k, false, 1.0f}, scores, idx, w); });
            CHECK(idx == ri_plain);
            CHECK(std::memcmp(w.data(), rw_plain.data(), k * sizeof(float)) == 0);
          }
        }
      }
      set_active_isa(saved);
    }
  }
  bodies.check();
}

TEST_CASE("router ties go to the lower expert index; all -inf/NaN selects expert 0 with weight 0") {
  const std::vector<float> W(4 * 2, 0.0f);  // every score sigmoid(0) = 0.5
  const std::vector<float> x{1.0f, 2.0f};
  std::vector<float> scores(4), w(2);
  std::vector<int32_t> idx(2);
  route(F32Matrix{W, 4, 2}, x, {}, RouterParams{2, false, 1.0f}, scores, idx, w);
  CHECK(idx == std::vector<int32_t>{0, 1});
  const std::vector<float> bias(4, -INFINITY);
  route(F32Matrix{W, 4, 2}, x, bias, RouterParams{2, true, 1.0f}, scores, idx, w);
  CHECK(idx == std::vector<int32_t>{0, 0});
  CHECK(w == std::vector<float>{0.0f, 0.0f});
}

TEST_CASE("route_rows: T inputs in one pass over the gate give each input's single-row bits, every body") {
  const k3::test::BodyCheck bodies{Kernel::router};
  static tbb::global_control allow(tbb::global_control::max_allowed_parallelism, 8);
  uint32_t seed = 0xBADC0DE;
  // 131 experts: blocks of 32/16/8 experts, then 3 alone; 13 inputs: groups of 8, 4 and 1 (AVX-512),
  // 4, 4, 4, 1 (AVX2); widths with and without an 8-element tail.
  for (size_t E : {5, 131}) {
    for (size_t n : {7, 257}) {
      CAPTURE(E);
      CAPTURE(n);
      const size_t k = std::min<size_t>(3, E), T = 13;
      std::vector<uint16_t> wb(E * n);
      std::vector<float> wf(E * n), x(T * n), bias(E);
      for (size_t i = 0; i < wb.size(); ++i) {
        wb[i] = static_cast<uint16_t>(xorshift(seed) >> 16) & 0xBFFF;
        wf[i] = bf16_to_f32(wb[i]);
      }
      for (auto& v : x) v = static_cast<float>(xorshift(seed) >> 8) / 8388608.0f - 1.0f;
      for (auto& v : bias) v = (static_cast<float>(xorshift(seed) >> 8) / 8388608.0f - 1.0f) * 0.1f;
      std::vector<int32_t> want_idx(T * k);
      std::vector<float> want_w(T * k);
      for (size_t t = 0; t < T; ++t) {
        std::vector<int32_t> ri;
        std::vector<float> rw;
        reference_route(wf, E, n, std::vector<float>(x.begin() + t * n, x.begin() + (t + 1) * n), bias, k,
                        true, 2.5f, ri, rw);
        std::copy(ri.begin(), ri.end(), want_idx.begin() + t * k);
        std::copy(rw.begin(), rw.end(), want_w.begin() + t * k);
      }
      const Isa saved = active_isa();
      for (Isa isa : supported_isas()) {
        set_active_isa(isa);
        const std::string isa_s = isa_name(isa);
        CAPTURE(isa_s);
        for (int threads : {1, 2}) {
          CAPTURE(threads);
          tbb::task_arena arena(threads);
          for (const DenseMatrix& g : {DenseMatrix(F32Matrix{wf, E, n}), DenseMatrix(Bf16Matrix{wb, E, n})}) {
            for (size_t rows : {size_t{1}, size_t{2}, size_t{5}, T}) {
              CAPTURE(rows);
              std::vector<float> scores(rows * E), w(rows * k);
              std::vector<int32_t> idx(rows * k);
              arena.execute([&] {
                route_rows(g, std::span(x).first(rows * n), rows, bias, RouterParams{k, true, 2.5f}, scores,
                           idx, w);
              });
              CHECK(std::equal(idx.begin(), idx.end(), want_idx.begin()));
              CHECK(std::memcmp(w.data(), want_w.data(), rows * k * sizeof(float)) == 0);
            }
          }
        }
      }
      set_active_isa(saved);
    }
  }
  bodies.check();
}
