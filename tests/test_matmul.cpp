// Bit-identity of the dense (docs/model.md §5.3) and MXFP4 (§5.4) matmuls: every available body, at
// thread counts 1, 2 and 7, at awkward sizes, equals a scalar reference written here from the
// spec's pseudo-code.
#include <doctest/doctest.h>
#include <tbb/global_control.h>
#include <tbb/task_arena.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/dispatch.hpp"
#include "kernels/matmul.hpp"
#include "kernels/mxfp4.hpp"
#include "tests/isa_bodies.hpp"

using namespace k3::kernels;

namespace {

struct Rng {
  uint32_t s;
  uint32_t next() {
    s ^= s << 13;
    s ^= s >> 17;
    s ^= s << 5;
    return s;
  }
  float unit() { return static_cast<float>(next() >> 8) / 8388608.0f - 1.0f; }  // [-1, 1)
};

// §5.3, straight from the pseudo-code.
float ref_dense(const std::vector<float>& w, size_t row, size_t n, const float* x) {
  const float* W = w.data() + row * n;
  double a[16] = {};
  for (size_t blk = 0; blk < n / 16; ++blk) {
    for (size_t l = 0; l < 16; ++l) {
      a[l] = std::fma(static_cast<double>(W[16 * blk + l]), static_cast<double>(x[16 * blk + l]), a[l]);
    }
  }
  double b[4];
  for (size_t j = 0; j < 4; ++j) b[j] = (a[j] + a[j + 4]) + (a[j + 8] + a[j + 12]);
  double acc = (b[0] + b[1]) + (b[2] + b[3]);
  for (size_t i = 16 * (n / 16); i < n; ++i)
    acc = std::fma(static_cast<double>(W[i]), static_cast<double>(x[i]), acc);
  return static_cast<float>(acc);
}

// §5.4, straight from the pseudo-code (element i: byte i>>1, low nibble when i is even).
float ref_mxfp4(const std::vector<uint8_t>& packed, const std::vector<uint8_t>& scales, size_t row, size_t in,
                const float* x) {
  static const float e2m1[16] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6, -0.0f, -0.5f, -1, -1.5f, -2, -3, -4, -6};
  const size_t G = 32, pc = (in + 1) / 2, sc = (in + G - 1) / G;
  const uint8_t* P = packed.data() + row * pc;
  const uint8_t* S = scales.data() + row * sc;
  double acc = 0.0;
  for (size_t g = 0; g < sc; ++g) {
    if (S[g] == 255) continue;
    const size_t n = std::min(G, in - g * G);
    double w[32];
    for (size_t i = 0; i < n; ++i) {
      const uint8_t byte = P[g * G / 2 + (i >> 1)];
      w[i] = e2m1[(i & 1) ? byte >> 4 : byte & 0xF];
    }
    double s[8] = {};
    for (size_t c = 0; c < n / 8; ++c) {
      for (size_t l = 0; l < 8; ++l)
        s[l] = std::fma(w[8 * c + l], static_cast<double>(x[g * G + 8 * c + l]), s[l]);
    }
    double sub = ((s[0] + s[4]) + (s[1] + s[5])) + ((s[2] + s[6]) + (s[3] + s[7]));
    for (size_t i = 8 * (n / 8); i < n; ++i) sub = std::fma(w[i], static_cast<double>(x[g * G + i]), sub);
    const float scale = std::ldexp(1.0f, static_cast<int>(S[g]) - 127);
    acc = acc + sub * static_cast<double>(scale);
  }
  return static_cast<float>(acc);
}

// Random bf16 bit patterns, exponent 0xFF excluded, with extra subnormals and zeros of both signs.
std::vector<uint16_t> bf16_patterns(Rng& rng, size_t n) {
  std::vector<uint16_t> out(n);
  for (auto& b : out) {
    do {
      b = static_cast<uint16_t>(rng.next() >> 16);
    } while ((b & 0x7F80) == 0x7F80);
    const uint32_t pick = rng.next() % 16;
    if (pick == 0) b &= 0x807F;  // subnormal (or zero)
    if (pick == 1) b &= 0x8000;  // +-0
  }
  return out;
}

std::vector<float> inputs(Rng& rng, size_t n) {
  std::vector<float> x(n);
  for (size_t i = 0; i < n; ++i) {
    x[i] = rng.unit();
    if (rng.next() % 8 == 0) x[i] = std::ldexp(x[i], static_cast<int>(rng.next() % 40) - 20);
  }
  return x;
}

// Runs `f` under every body and thread count; every result must equal `want` bit for bit.
template <class F>
void every_body_and_thread_count(const std::vector<float>& want, F&& f) {
  // oneTBB caps workers at the core count by default; lift it so 7 threads really run.
  static tbb::global_control allow(tbb::global_control::max_allowed_parallelism, 8);
  const Isa saved = active_isa();
  for (Isa isa : supported_isas()) {
    set_active_isa(isa);
    for (int threads : {1, 2, 7}) {
      const std::string isa_s = isa_name(isa);
      CAPTURE(isa_s);
      CAPTURE(threads);
      std::vector<float> got(want.size(), NAN);
      tbb::task_arena arena(threads);
      arena.execute([&] { f(got); });
      CHECK(std::memcmp(got.data(), want.data(), want.size() * sizeof(float)) == 0);
    }
  }
  set_active_isa(saved);
}

}  // namespace

TEST_CASE("dense f32 and bf16 matmul: every body and thread count equals the §5.3 reference") {
  const k3::test::BodyCheck bodies{Kernel::matmul};
  Rng rng{0x1234567};
  for (size_t cols : {1, 15, 16, 17, 31, 48, 257, 1040}) {
    for (size_t rows : {1, 3, 64, 65, 129}) {
      for (size_t tokens : {1, 3, 5, 7, 8}) {  // 7, 8: the AVX-512 body's triples, then pairs
        CAPTURE(cols);
        CAPTURE(rows);
        CAPTURE(tokens);
        const auto bits = bf16_patterns(rng, rows * cols);
        std::vector<float> wf(bits.size());
        for (size_t i = 0; i < bits.size(); ++i) wf[i] = bf16_to_f32(bits[i]);
        const auto x = inputs(rng, tokens * cols);
        std::vector<float> want(tokens * rows);
        for (size_t t = 0; t < tokens; ++t) {
          for (size_t r = 0; r < rows; ++r) want[t * rows + r] = ref_dense(wf, r, cols, x.data() + t * cols);
        }
        const F32Matrix mf{wf, rows, cols};
        const Bf16Matrix mb{bits, rows, cols};
        every_body_and_thread_count(want, [&](std::vector<float>& y) { matmul(mf, x, tokens, y); });
        every_body_and_thread_count(want, [&](std::vector<float>& y) { matmul(mb, x, tokens, y); });
        if (tokens == 1) {
          every_body_and_thread_count(want, [&](std::vector<float>& y) { matvec(mb, x, y); });
          every_body_and_thread_count(want, [&](std::vector<float>& y) {
            for (size_t r = 0; r < rows; ++r) y[r] = dot_row(mf, r, x);
          });
        }
      }
    }
  }
  bodies.check();
}

// Random data rarely shows a different reduction tree after the final f32 rounding: the f64
// sums differ by ~1e-16 of their size. Here a few inputs are huge and their weights come from a
// small set, so the huge products often cancel exactly and the f64 rounding of the small remainder
// shows in the f32 result. The test first proves it can tell the §5.3 tree from "A+B first".
TEST_CASE("dense reduction tree is pinned: cancellation-heavy inputs") {
  const k3::test::BodyCheck bodies{Kernel::matmul};
  Rng rng{0xFEED};
  const size_t cols = 272, rows = 300;  // 17 blocks of 16, no tail; > 64 rows
  std::vector<float> x(cols);
  for (auto& v : x) v = rng.unit();
  const size_t big[] = {3, 11, 7, 15};
  for (size_t p : big) x[p] = 0x1p40f;
  std::vector<uint16_t> bits(rows * cols);
  for (size_t r = 0; r < rows; ++r) {
    for (size_t i = 0; i < cols; ++i) {
      bits[r * cols + i] = static_cast<uint16_t>(std::bit_cast<uint32_t>(rng.unit()) >> 16);
    }
    for (size_t p : big) {
      bits[r * cols + p] = rng.next() % 2 ? 0x3F80 : 0xBF80;  // +-1: the huge products often cancel
    }
  }
  std::vector<float> wf(bits.size());
  for (size_t i = 0; i < bits.size(); ++i) wf[i] = bf16_to_f32(bits[i]);
  std::vector<float> want(rows);
  size_t differs = 0;
  for (size_t r = 0; r < rows; ++r) {
    want[r] = ref_dense(wf, r, cols, x.data());
    // The tempting AVX-512 reduction: A+B first pairs a_j with a_{j+8}.
    double a[16] = {};
    for (size_t i = 0; i < cols; ++i) a[i % 16] += static_cast<double>(wf[r * cols + i]) * x[i];
    double c[8];
    for (size_t j = 0; j < 8; ++j) c[j] = a[j] + a[j + 8];
    const double alt = ((c[0] + c[4]) + (c[1] + c[5])) + ((c[2] + c[6]) + (c[3] + c[7]));
    differs += static_cast<float>(alt) != want[r] ? 1 : 0;
  }
  CHECK(differs > rows / 20);
  const F32Matrix mf{wf, rows, cols};
  const Bf16Matrix mb{bits, rows, cols};
  every_body_and_thread_count(want, [&](std::vector<float>& y) { matvec(mf, x, y); });
  every_body_and_thread_count(want, [&](std::vector<float>& y) { matvec(mb, x, y); });
  std::vector<float> x3(3 * cols), want3(3 * rows);
  for (size_t t = 0; t < 3; ++t) std::copy(x.begin(), x.end(), x3.begin() + t * cols);
  for (size_t t = 0; t < 3; ++t) std::copy(want.begin(), want.end(), want3.begin() + t * rows);
  every_body_and_thread_count(want3, [&](std::vector<float>& y) { matmul(mb, x3, 3, y); });
  bodies.check();
}

TEST_CASE("MXFP4 reduction tree is pinned: cancellation-heavy inputs") {
  const k3::test::BodyCheck bodies{Kernel::matmul};
  Rng rng{0xBEEF};
  const size_t cols = 256, rows = 300;
  std::vector<float> x(cols);
  for (auto& v : x) v = rng.unit();
  const size_t big[] = {0, 1, 4, 13};
  for (size_t p : big) x[p] = 0x1p40f;
  std::vector<uint8_t> packed(rows * cols / 2), scales(rows * cols / 32, 127);
  for (auto& b : packed) b = static_cast<uint8_t>(rng.next() >> 24);
  for (size_t r = 0; r < rows; ++r) {
    for (size_t p : big) {  // E2M1 +-1 (nibble 2 / 10) where x is huge: the products often cancel
      uint8_t& b = packed[r * cols / 2 + p / 2];
      const uint8_t nib = rng.next() % 2 ? 0x2 : 0xA;
      b = (p % 2) ? static_cast<uint8_t>((b & 0x0F) | (nib << 4)) : static_cast<uint8_t>((b & 0xF0) | nib);
    }
  }
  std::vector<float> want(rows);
  size_t differs = 0;
  for (size_t r = 0; r < rows; ++r) {
    want[r] = ref_mxfp4(packed, scales, r, cols, x.data());
    // A plausible wrong tree: adjacent lanes first.
    static const float e2m1[16] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6, -0.0f, -0.5f, -1, -1.5f, -2, -3, -4, -6};
    double acc = 0.0;
    for (size_t g = 0; g < cols / 32; ++g) {
      double s[8] = {};
      for (size_t i = 0; i < 32; ++i) {
        const uint8_t b = packed[r * cols / 2 + g * 16 + i / 2];
        s[i % 8] += static_cast<double>(e2m1[(i & 1) ? b >> 4 : b & 0xF]) * x[g * 32 + i];
      }
      acc = acc + (((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7])));
    }
    differs += static_cast<float>(acc) != want[r] ? 1 : 0;
  }
  CHECK(differs > rows / 20);
  const Mxfp4Matrix m{packed, scales, rows, cols};
  every_body_and_thread_count(want, [&](std::vector<float>& y) { matvec(m, x, y); });
  std::vector<float> x3(3 * cols), want3(3 * rows);
  for (size_t t = 0; t < 3; ++t) std::copy(x.begin(), x.end(), x3.begin() + t * cols);
  for (size_t t = 0; t < 3; ++t) std::copy(want.begin(), want.end(), want3.begin() + t * rows);
  every_body_and_thread_count(want3, [&](std::vector<float>& y) { matmul(m, x3, 3, y); });
  bodies.check();
}

TEST_CASE("bf16 and f32 weights of equal values give identical bits (257 in, 129 out)") {
  const k3::test::BodyCheck bodies{Kernel::matmul};
  uint32_t s = 0xC0FFEE;
  auto next = [&] {
    s ^= s << 13;
    s ^= s >> 17;
    s ^= s << 5;
    return s;
  };
  const size_t in = 257, out = 129;
  std::vector<uint16_t> bits(in * out);
  std::vector<float> wf(in * out), x(in);
  for (size_t i = 0; i < bits.size(); ++i) {
    do {
      bits[i] = static_cast<uint16_t>(next() >> 16);
    } while ((bits[i] & 0x7F80) == 0x7F80);
    wf[i] = bf16_to_f32(bits[i]);
  }
  for (auto& v : x) v = static_cast<float>(next() >> 8) / 8388608.0f - 1.0f;
  for (Isa isa : supported_isas()) {
    const std::string isa_s = isa_name(isa);
    CAPTURE(isa_s);
    set_active_isa(isa);
    std::vector<float> yf(out), yb(out);
    matvec(F32Matrix{wf, out, in}, x, yf);
    matvec(Bf16Matrix{bits, out, in}, x, yb);
    CHECK(std::memcmp(yf.data(), yb.data(), out * sizeof(float)) == 0);
  }
  set_active_isa(supported_isas().back());
  bodies.check();
}

TEST_CASE("MXFP4 matmul: every body and thread count equals the §5.4 reference") {
  const k3::test::BodyCheck bodies{Kernel::matmul};
  Rng rng{0xABCDEF};
  const uint8_t special[] = {0, 1, 254, 255};
  for (size_t cols : {2, 8, 14, 31, 32, 33, 38, 64, 70, 71, 96, 250, 3584}) {
    for (size_t rows : {1, 5, 65, 70}) {
      for (size_t tokens : {1, 2}) {
        CAPTURE(cols);
        CAPTURE(rows);
        CAPTURE(tokens);
        const size_t pc = mxfp4_packed_cols(cols), sc = mxfp4_scale_cols(cols);
        std::vector<uint8_t> packed(rows * pc), scales(rows * sc);
        for (auto& b : packed) b = static_cast<uint8_t>(rng.next() >> 24);
        for (size_t r = 0; r < rows; ++r) {
          for (size_t g = 0; g < sc; ++g) {
            uint8_t b = static_cast<uint8_t>(112 + rng.next() % 32);  // realistic scales
            const uint32_t pick = rng.next() % 8;
            if (pick == 0) b = special[rng.next() % 4];
            if (r % 4 == 3) b = static_cast<uint8_t>(rng.next() >> 24);  // anything, 0..255
            scales[r * sc + g] = b;
          }
        }
        const auto x = inputs(rng, tokens * cols);
        std::vector<float> want(tokens * rows);
        for (size_t t = 0; t < tokens; ++t) {
          for (size_t r = 0; r < rows; ++r) {
            want[t * rows + r] = ref_mxfp4(packed, scales, r, cols, x.data() + t * cols);
          }
        }
        const Mxfp4Matrix m{packed, scales, rows, cols};
        every_body_and_thread_count(want, [&](std::vector<float>& y) { matmul(m, x, tokens, y); });
        if (tokens == 1) {
          every_body_and_thread_count(want, [&](std::vector<float>& y) {
            for (size_t r = 0; r < rows; ++r) y[r] = dot_row(m, r, x);
          });
        }
      }
    }
  }
  bodies.check();
}

TEST_CASE("matmul_many: a layer's projections of one x in one pass equal one matmul each, every body") {
  const k3::test::BodyCheck bodies{Kernel::matmul};
  Rng rng{0x5EED};
  for (size_t cols : {17, 64, 257, 1040}) {
    for (size_t tokens : {1, 3, 8}) {
      CAPTURE(cols);
      CAPTURE(tokens);
      // bf16 of 129 rows (parallel), f32 of 3 rows (serial alone), MXFP4 of 70, bf16 of exactly 64.
      const auto b1 = bf16_patterns(rng, 129 * cols), b2 = bf16_patterns(rng, 64 * cols);
      std::vector<float> f(3 * cols);
      for (float& v : f) v = rng.unit();
      const size_t pc = mxfp4_packed_cols(cols), sc = mxfp4_scale_cols(cols);
      std::vector<uint8_t> packed(70 * pc), scales(70 * sc);
      for (auto& b : packed) b = static_cast<uint8_t>(rng.next() >> 24);
      for (auto& b : scales) b = static_cast<uint8_t>(112 + rng.next() % 32);
      const Matrix ms[] = {Bf16Matrix{b1, 129, cols}, F32Matrix{f, 3, cols},
                           Mxfp4Matrix{packed, scales, 70, cols}, Bf16Matrix{b2, 64, cols}};
      const auto x = inputs(rng, tokens * cols);
      std::vector<float> want;
      for (const Matrix& m : ms) {
        std::vector<float> y(tokens * rows_of(m));
        matmul(m, x, tokens, y);
        want.insert(want.end(), y.begin(), y.end());
      }
      every_body_and_thread_count(want, [&](std::vector<float>& y) {
        std::vector<MatmulOut> outs;
        size_t at = 0;
        for (const Matrix& m : ms) {
          outs.push_back({&m, std::span(y).subspan(at, tokens * rows_of(m))});
          at += tokens * rows_of(m);
        }
        matmul_many(outs, x, tokens);
      });
    }
  }
  bodies.check();
  // Widths that differ, or an output too small: refused, nothing computed.
  const auto b = bf16_patterns(rng, 8 * 16);
  const Matrix a{Bf16Matrix{b, 8, 16}}, c{Bf16Matrix{b, 16, 8}};
  std::vector<float> x(16, 1.0f), y1(8), y2(16);
  const MatmulOut differ[] = {{&a, y1}, {&c, y2}};
  CHECK_THROWS_AS(matmul_many(differ, x, 1), std::invalid_argument);
  const MatmulOut small[] = {{&a, std::span(y1).first(7)}};
  CHECK_THROWS_AS(matmul_many(small, x, 1), std::invalid_argument);
}

TEST_CASE("MXFP4: a scale byte of 255 skips its group even against inf / NaN inputs") {
  const k3::test::BodyCheck bodies{Kernel::matmul};
  const size_t cols = 64;
  std::vector<uint8_t> packed(32, 0x11), scales{255, 127};
  std::vector<float> x(cols, 1.0f);
  x[3] = INFINITY;
  x[7] = NAN;
  const Mxfp4Matrix m{packed, scales, 1, cols};
  for (Isa isa : supported_isas()) {
    const std::string isa_s = isa_name(isa);
    CAPTURE(isa_s);
    set_active_isa(isa);
    std::vector<float> y(1);
    matvec(m, x, y);
    CHECK(y[0] == 16.0f);  // 32 elements of 0.5 in the second group
  }
  set_active_isa(supported_isas().back());
  bodies.check();
}
