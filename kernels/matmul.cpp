#include "kernels/matmul.hpp"

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <stdexcept>
#include <vector>

#include "kernels/dispatch.hpp"
#include "kernels/matmul_bodies.hpp"
#include "kernels/mxfp4.hpp"

namespace k3::kernels {

namespace {

// Serial below this many output rows (the reference's threshold), row-parallel above it. Rows are
// independent, so the split never changes a bit.
constexpr size_t kParallelRows = 64;

detail::MatmulBodies bodies() {
  const Isa isa = active_isa();
  count_body_run(Kernel::matmul, isa);
  switch (isa) {
    case Isa::avx512:
      return detail::matmul_bodies_avx512();
    case Isa::avx2:
      return detail::matmul_bodies_avx2();
    case Isa::scalar:
      break;
  }
  return detail::matmul_bodies_scalar();
}

// The fused exp3 body (docs/codec.md, "Fused exp3 body"): AVX-512BW + VBMI + VBMI2 only; elsewhere,
// and when switched off, exp3 matrices take the tile path as exp4 ones do.
bool cpu_has_vbmi2() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512vbmi") && __builtin_cpu_supports("avx512vbmi2");
}
std::atomic<bool> g_exp3_direct{true};
std::atomic<uint64_t> g_exp3_direct_runs{0}, g_exp3_direct_refused{0};

detail::Exp3Rows exp3_body() {
  static const bool has = isa_supported(Isa::avx512) && cpu_has_vbmi2();
  if (!has || active_isa() != Isa::avx512 || !g_exp3_direct.load(std::memory_order_relaxed)) return nullptr;
  return detail::matmul_exp3_avx512();
}

// Rows go to threads in whole blocks, so the bodies' multi-row paths stay in use.
constexpr size_t kRowBlock = 8;

// Row blocks a task takes so that it holds at least `min_weights` weights of `cols`-wide rows.
size_t blocks_per_task(size_t cols, size_t min_weights) {
  return std::max<size_t>(1, min_weights / kRowBlock / std::max<size_t>(cols, 1));
}

// Rows in tasks of at least `min_weights` weights (a coded matrix: larger tiles, fewer blocks cut
// at their edges); serial up to kParallelRows rows.
template <class Body>
void for_rows(size_t rows, size_t cols, const Body& body, size_t min_weights) {
  if (rows <= kParallelRows) {
    body(0, rows);
    return;
  }
  const size_t blocks = (rows + kRowBlock - 1) / kRowBlock;
  tbb::parallel_for(tbb::blocked_range<size_t>(0, blocks, blocks_per_task(cols, min_weights)),
                    [&](const tbb::blocked_range<size_t>& r) {
                      body(r.begin() * kRowBlock, std::min(r.end() * kRowBlock, rows));
                    });
}

// The weights a task takes at least: a coded matrix's tiles of 64k-128k weights (128-256 KiB decoded,
// 16-32 exp4 or exp3 blocks) stay in L2, and a block cut by a tile's edge is decoded by both tiles
// (the fused exp3 body takes the same tasks: larger ones measured no faster).
size_t min_task(const Matrix& w) {
  return std::holds_alternative<CodedBf16Matrix>(w) ? 131072 : 32768;
}

// Rows [a, e) of w into y[t * y_stride + (r - r0)]. pq_x: xw is in the P/Q layout (widen_pq), for
// b.bf16_pq; only with a Bf16Matrix.
void rows_of_matrix(const detail::MatmulBodies& b, const Matrix& w, const double* xw, bool pq_x,
                    size_t tokens, float* y, size_t y_stride, size_t r0, size_t a, size_t e) {
  std::visit(
      [&](const auto& m) {
        using M = std::decay_t<decltype(m)>;
        float* yr = y + (a - r0);
        if constexpr (std::is_same_v<M, F32Matrix>) {
          b.f32(m.data.data() + a * m.cols, e - a, m.cols, xw, tokens, yr, y_stride);
        } else if constexpr (std::is_same_v<M, Bf16Matrix>) {
          (pq_x ? b.bf16_pq : b.bf16)(m.data.data() + a * m.cols, e - a, m.cols, xw, tokens, yr, y_stride);
        } else if constexpr (std::is_same_v<M, CodedBf16Matrix>) {
          // exp3 with the fused body: straight from the stored blocks (a malformed block: the tile
          // path below, whose decode reports it).
          if (const detail::Exp3Rows exp3 = exp3_body(); exp3 != nullptr) {
            thread_local std::vector<Exp3Block> blocks;
            const uint64_t v0 = m.first + a * m.cols;
            if (m.src->exp3_blocks(v0, (e - a) * m.cols, blocks)) {
              if (exp3(blocks.data(), blocks.size(), v0, e - a, m.cols, xw, tokens, yr, y_stride)) {
                g_exp3_direct_runs.fetch_add(1, std::memory_order_relaxed);
                return;
              }
              g_exp3_direct_refused.fetch_add(1, std::memory_order_relaxed);
            }
          }
          // The rows' values decoded into this thread's tile, then the bf16 body over it: each row's
          // dot product reads the same values in the same order, so the bits are Bf16Matrix's.
          thread_local std::vector<uint16_t> tile;
          const size_t count = (e - a) * m.cols;
          if (tile.size() < count) tile.resize(count);
          m.src->decode_values(m.first + a * m.cols, count, tile.data());
          b.bf16(tile.data(), e - a, m.cols, xw, tokens, yr, y_stride);
        } else {
          b.mxfp4(m.packed.data() + a * mxfp4_packed_cols(m.cols),
                  m.scales.data() + a * mxfp4_scale_cols(m.cols), e - a, m.cols, xw, tokens, yr, y_stride);
        }
      },
      w);
}

// Rows [r0, r1) (all rows, split over threads, when `parallel`); y[t * y_stride + (r - r0)].
void run(const detail::MatmulBodies& b, const Matrix& w, const double* xw, bool pq_x, size_t tokens, float* y,
         size_t y_stride, size_t r0, size_t r1, bool parallel) {
  auto body = [&](size_t a, size_t e) { rows_of_matrix(b, w, xw, pq_x, tokens, y, y_stride, r0, a, e); };
  if (parallel) {
    for_rows(rows_of(w), cols_of(w), body, min_task(w));
  } else {
    body(r0, r1);
  }
}

// Whether a matrix's rows take x widened in the P/Q layout (widen_pq, MatmulBodies::bf16_pq): a
// plain bf16 matrix against several tokens, where the active ISA has that body.
bool pq_layout(const detail::MatmulBodies& b, const Matrix& w, size_t tokens) {
  return tokens > 1 && b.bf16_pq != nullptr && std::holds_alternative<Bf16Matrix>(w);
}

std::vector<double> widen(std::span<const float> x) {
  std::vector<double> xw(x.size());
  for (size_t i = 0; i < x.size(); ++i) xw[i] = static_cast<double>(x[i]);
  return xw;
}

// `tokens` rows of `cols`, widened with each full block of 16 columns regrouped into the AVX-512 bf16
// body's lanes (x0-3, x8-11, then x4-7, x12-15; MatmulBodies::bf16_pq) and the columns past the last
// full block in place. The same values, moved: no bit of any product changes.
std::vector<double> widen_pq(std::span<const float> x, size_t tokens, size_t cols) {
  std::vector<double> xw(tokens * cols);
  const size_t full = cols / 16 * 16;
  for (size_t t = 0; t < tokens; ++t) {
    const float* in = x.data() + t * cols;
    double* out = xw.data() + t * cols;
    for (size_t i = 0; i < full; i += 16)
      for (size_t j = 0; j < 4; ++j) {
        out[i + j] = in[i + j];
        out[i + 4 + j] = in[i + 8 + j];
        out[i + 8 + j] = in[i + 4 + j];
        out[i + 12 + j] = in[i + 12 + j];
      }
    for (size_t i = full; i < cols; ++i) out[i] = in[i];
  }
  return xw;
}

}  // namespace

void matvec(const Matrix& w, std::span<const float> x, std::span<float> y) {
  matmul(w, x, 1, y);
}

void matmul(const Matrix& w, std::span<const float> x, size_t tokens, std::span<float> y) {
  const detail::MatmulBodies b = bodies();
  const size_t cols = cols_of(w);
  const bool pq_x = pq_layout(b, w, tokens);
  const std::vector<double> xw =
      pq_x ? widen_pq(x.first(tokens * cols), tokens, cols) : widen(x.first(tokens * cols));
  run(b, w, xw.data(), pq_x, tokens, y.data(), rows_of(w), 0, rows_of(w), true);
}

void matmul_many(std::span<const MatmulOut> outs, std::span<const float> x, size_t tokens) {
  if (outs.empty()) return;
  const size_t cols = cols_of(*outs[0].w);
  if (x.size() < tokens * cols) throw std::invalid_argument("matmul_many: x is smaller than tokens x cols");
  const detail::MatmulBodies b = bodies();
  bool any_pq = false, any_plain = false;
  for (const MatmulOut& o : outs) {
    if (cols_of(*o.w) != cols) throw std::invalid_argument("matmul_many: the matrices' widths differ");
    if (o.y.size() < tokens * rows_of(*o.w))
      throw std::invalid_argument("matmul_many: an output is too small");
    (pq_layout(b, *o.w, tokens) ? any_pq : any_plain) = true;
  }
  // x widened once per layout any matrix needs, as matmul widens it for that matrix.
  const std::span<const float> xs = x.first(tokens * cols);
  const std::vector<double> xw_pq = any_pq ? widen_pq(xs, tokens, cols) : std::vector<double>();
  const std::vector<double> xw = any_plain ? widen(xs) : std::vector<double>();

  // Tasks: (matrix, rows [a, e)). A matrix of at most kParallelRows rows is one task, as matmul runs
  // it serially; a larger one is cut into whole row blocks of at least min_task weights. The tasks
  // then go to the threads as one range (consecutive tasks together), never changing a row's bits.
  struct Task {
    uint32_t out;
    size_t a, e;
  };
  std::vector<Task> tasks;
  size_t all_rows = 0;
  for (size_t i = 0; i < outs.size(); ++i) {
    const size_t rows = rows_of(*outs[i].w);
    all_rows += rows;
    const size_t step =
        rows <= kParallelRows ? rows : kRowBlock * blocks_per_task(cols, min_task(*outs[i].w));
    for (size_t a = 0; a < rows; a += step) tasks.push_back({uint32_t(i), a, std::min(rows, a + step)});
  }
  auto run_tasks = [&](size_t t0, size_t t1) {
    for (size_t t = t0; t < t1; ++t) {
      const MatmulOut& o = outs[tasks[t].out];
      const bool pq = pq_layout(b, *o.w, tokens);
      rows_of_matrix(b, *o.w, pq ? xw_pq.data() : xw.data(), pq, tokens, o.y.data(), rows_of(*o.w), 0,
                     tasks[t].a, tasks[t].e);
    }
  };
  if (all_rows <= kParallelRows) {
    run_tasks(0, tasks.size());
    return;
  }
  tbb::parallel_for(tbb::blocked_range<size_t>(0, tasks.size()),
                    [&](const tbb::blocked_range<size_t>& r) { run_tasks(r.begin(), r.end()); });
}

float dot_row(const Matrix& w, size_t row, std::span<const float> x) {
  const std::vector<double> xw = widen(x.first(cols_of(w)));
  float out = 0.0f;
  run(bodies(), w, xw.data(), false, 1, &out, 1, row, row + 1, false);
  return out;
}

bool exp3_direct_available() {
  return isa_supported(Isa::avx512) && cpu_has_vbmi2();
}
void set_exp3_direct(bool on) {
  g_exp3_direct.store(on, std::memory_order_relaxed);
}
uint64_t exp3_direct_runs() {
  return g_exp3_direct_runs.load(std::memory_order_relaxed);
}
uint64_t exp3_direct_refused() {
  return g_exp3_direct_refused.load(std::memory_order_relaxed);
}

float e8m0_to_f32(uint8_t b) {
  return std::ldexp(1.0f, static_cast<int>(b) - 127);
}

namespace detail {

namespace {

// §5.3: 16 f64 lanes over full blocks of 16, fixed tree, then a sequential tail. Every product of
// two f32-representable values is exact in f64, so multiply-then-add equals fma64 here.
template <class T, class Widen>
float dense_dot(const T* w, const double* x, size_t n, Widen widen) {
  double a[16] = {};
  const size_t full = n / 16 * 16;
  for (size_t i = 0; i < full; i += 16) {
    for (size_t l = 0; l < 16; ++l) a[l] += widen(w[i + l]) * x[i + l];
  }
  double b[4];
  for (size_t j = 0; j < 4; ++j) b[j] = (a[j] + a[j + 4]) + (a[j + 8] + a[j + 12]);
  double acc = (b[0] + b[1]) + (b[2] + b[3]);
  for (size_t i = full; i < n; ++i) acc += widen(w[i]) * x[i];
  return static_cast<float>(acc);
}

void f32_dot_rows(const float* w, size_t rows, size_t cols, const double* x, size_t tokens, float* y,
                  size_t y_stride) {
  auto widen = [](float v) { return static_cast<double>(v); };
  for (size_t r = 0; r < rows; ++r) {
    for (size_t t = 0; t < tokens; ++t) {
      y[t * y_stride + r] = dense_dot(w + r * cols, x + t * cols, cols, widen);
    }
  }
}

void bf16_dot_rows(const uint16_t* w, size_t rows, size_t cols, const double* x, size_t tokens, float* y,
                   size_t y_stride) {
  auto widen = [](uint16_t v) { return static_cast<double>(bf16_to_f32(v)); };
  for (size_t r = 0; r < rows; ++r) {
    for (size_t t = 0; t < tokens; ++t) {
      y[t * y_stride + r] = dense_dot(w + r * cols, x + t * cols, cols, widen);
    }
  }
}

// §5.4: per group, 8 f64 lanes (lane l takes elements l, 8+l, 16+l, 24+l), fixed tree, sequential
// tail, then ONE multiply by the scale and an f64 add into the row accumulator.
float mxfp4_dot(const uint8_t* packed, const uint8_t* scales, size_t cols, const double* x) {
  double acc = 0.0;
  const size_t groups = mxfp4_scale_cols(cols);
  for (size_t g = 0; g < groups; ++g) {
    if (scales[g] == kE8m0Skip) continue;  // skipped, not multiplied by 0 (0 * inf would be NaN)
    const size_t n = std::min(kMxfp4Group, cols - g * kMxfp4Group);
    const uint8_t* bytes = packed + g * kMxfp4Group / 2;
    const double* xg = x + g * kMxfp4Group;
    // Low nibble = even element, high nibble = odd element.
    auto elem = [&](size_t i) {
      const uint8_t b = bytes[i >> 1];
      return static_cast<double>(kE2m1[(i & 1) ? (b >> 4) : (b & 0xF)]);
    };
    double s[8] = {};
    const size_t full = n / 8 * 8;
    for (size_t c = 0; c < full; c += 8) {
      for (size_t l = 0; l < 8; ++l) s[l] += elem(c + l) * xg[c + l];
    }
    double sub = ((s[0] + s[4]) + (s[1] + s[5])) + ((s[2] + s[6]) + (s[3] + s[7]));
    for (size_t i = full; i < n; ++i) sub += elem(i) * xg[i];
    acc = acc + sub * static_cast<double>(e8m0_to_f32(scales[g]));
  }
  return static_cast<float>(acc);
}

void mxfp4_dot_rows(const uint8_t* packed, const uint8_t* scales, size_t rows, size_t cols, const double* x,
                    size_t tokens, float* y, size_t y_stride) {
  const size_t pc = mxfp4_packed_cols(cols);
  const size_t sc = mxfp4_scale_cols(cols);
  for (size_t r = 0; r < rows; ++r) {
    for (size_t t = 0; t < tokens; ++t) {
      y[t * y_stride + r] = mxfp4_dot(packed + r * pc, scales + r * sc, cols, x + t * cols);
    }
  }
}

}  // namespace

MatmulBodies matmul_bodies_scalar() {
  return {f32_dot_rows, bf16_dot_rows, mxfp4_dot_rows, nullptr};
}

}  // namespace detail

}  // namespace k3::kernels
