// Kernel speed at the real shapes, against this machine's own DRAM roofline.
//
// First a streaming read over a buffer far larger than the LLC measures the read bandwidth at 1
// and 2 threads; then the matmuls run at 1 and 2 threads for every body the CPU supports:
//   bf16 matvec 12288x7168 (KDA q_proj), f32 matvec of the same shape, the bf16 matmul over a
//   batch of B = 2, 4, 8 rows against B matvecs (best body only: vs_matvecs, see BM_bf16_batch),
//   one MXFP4 routed expert (w1, w3 3072x3584 and w2 3584x3072) streamed from a set of experts
//   larger than the LLC, and the single hot w1 matrix the C reference engine's own benchmark uses;
//   and one KDA layer's recurrence step (96 heads, D = 128), single thread.
// Counters: GB/s of weights read and GFLOP/s (2 per weight) over the mean iteration, GB/s_best over
// the best one, roofline = GB/s_best / best DRAM GB/s at the same thread count, bitexact = output
// equal (memcmp) to the scalar body's.
// The last line of the output is `roofline bf16_2t=<fraction> mxfp4_2t=<fraction>` for the body
// the dispatcher would pick: its best GB/s at 2 threads over the best 2-thread DRAM read rate.
#include <benchmark/benchmark.h>
#include <emmintrin.h>
#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>
#include <tbb/partitioner.h>
#include <tbb/task_arena.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kernels/dispatch.hpp"
#include "kernels/kda.hpp"
#include "kernels/matmul.hpp"
#include "kernels/mxfp4.hpp"
#include "kernels/router.hpp"

namespace {

using namespace k3::kernels;
using Clock = std::chrono::steady_clock;

constexpr int kMaxThreads = 2;

// Best rates seen as the benchmarks run (in registration order: the DRAM probe first). On a box
// shared with other work the mean of a run mostly measures the neighbours, so the roofline compares
// best single iterations: the DRAM read's against the kernel's.
struct Measured {
  double dram_gbs[kMaxThreads + 1] = {};
  double bf16_gbs_2t = 0.0, mxfp4_gbs_2t = 0.0;  // best body
} g_measured;

void keep_max(double& slot, double v) {
  slot = v > slot ? v : slot;
}

Isa best_isa() {
  return supported_isas().back();
}

uint32_t xorshift(uint32_t& s) {
  s ^= s << 13;
  s ^= s >> 17;
  s ^= s << 5;
  return s;
}

struct Timing {
  double mean = 0.0, best = 0.0;  // seconds per iteration
};

// Runs `body` per iteration inside an arena of `threads` threads with the given body selected.
template <class F>
Timing run_timed(benchmark::State& st, Isa isa, int threads, F&& body) {
  const Isa saved = active_isa();
  set_active_isa(isa);
  tbb::task_arena arena(threads);
  arena.execute(body);  // warm
  double total = 0.0, best = 1e30;
  for (auto _ : st) {
    const auto t0 = Clock::now();
    arena.execute(body);
    const double t = std::chrono::duration<double>(Clock::now() - t0).count();
    total += t;
    best = t < best ? t : best;
  }
  set_active_isa(saved);
  st.SetLabel(std::string(isa_name(isa)) + " " + std::to_string(threads) + "t");
  if (st.iterations() == 0) return {};
  return {total / static_cast<double>(st.iterations()), best};
}

// GB/s and GFLOP/s over the mean iteration; GB/s_best and roofline (against the best DRAM read at
// the same thread count) over the best one.
void set_rates(benchmark::State& st, double bytes, double flops, Timing t, int threads, bool exact) {
  st.counters["GB/s"] = bytes / t.mean / 1e9;
  st.counters["GB/s_best"] = bytes / t.best / 1e9;
  if (flops > 0) st.counters["GFLOP/s"] = flops / t.mean / 1e9;
  const double dram = g_measured.dram_gbs[threads];
  if (dram > 0) st.counters["roofline"] = bytes / t.best / 1e9 / dram;
  st.counters["bitexact"] = exact ? 1 : 0;
}

// ---- DRAM read bandwidth -------------------------------------------------------------------

constexpr size_t kDramBytes = size_t{1} << 30;  // 1 GiB, far beyond a 32 MiB LLC

const uint64_t* dram_buffer() {
  static std::unique_ptr<uint64_t[]> buf = [] {
    std::unique_ptr<uint64_t[]> b(new uint64_t[kDramBytes / 8]);
    for (size_t i = 0; i < kDramBytes / 8; ++i) b[i] = i;  // touch every page
    return b;
  }();
  return buf.get();
}

// Four independent 16-byte streams keep the loads, not the adds, the limit.
uint64_t read_sum(const uint64_t* p, size_t n) {
  __m128i a0 = _mm_setzero_si128(), a1 = a0, a2 = a0, a3 = a0;
  const __m128i* v = reinterpret_cast<const __m128i*>(p);
  for (size_t i = 0; i + 8 <= n / 2; i += 8) {
    a0 = _mm_add_epi64(a0, _mm_add_epi64(_mm_load_si128(v + i), _mm_load_si128(v + i + 1)));
    a1 = _mm_add_epi64(a1, _mm_add_epi64(_mm_load_si128(v + i + 2), _mm_load_si128(v + i + 3)));
    a2 = _mm_add_epi64(a2, _mm_add_epi64(_mm_load_si128(v + i + 4), _mm_load_si128(v + i + 5)));
    a3 = _mm_add_epi64(a3, _mm_add_epi64(_mm_load_si128(v + i + 6), _mm_load_si128(v + i + 7)));
  }
  const __m128i s = _mm_add_epi64(_mm_add_epi64(a0, a1), _mm_add_epi64(a2, a3));
  uint64_t out[2];
  _mm_storeu_si128(reinterpret_cast<__m128i*>(out), s);
  return out[0] + out[1];
}

void BM_dram_read(benchmark::State& st) {
  const int threads = static_cast<int>(st.range(0));
  const uint64_t* buf = dram_buffer();
  const size_t words = kDramBytes / 8;
  std::atomic<uint64_t> sink{0};
  const Timing t = run_timed(st, Isa::scalar, threads, [&] {
    // One contiguous slice per thread, like the row-parallel matmuls.
    tbb::parallel_for(
        tbb::blocked_range<size_t>(0, static_cast<size_t>(threads)),
        [&](const tbb::blocked_range<size_t>& r) {
          for (size_t part = r.begin(); part < r.end(); ++part) {
            const size_t per = words / static_cast<size_t>(threads);
            sink += read_sum(buf + part * per, per);
          }
        },
        tbb::static_partitioner());
  });
  benchmark::DoNotOptimize(sink.load());
  keep_max(g_measured.dram_gbs[threads], static_cast<double>(kDramBytes) / t.best / 1e9);
  st.counters["GB/s"] = static_cast<double>(kDramBytes) / t.mean / 1e9;
  st.counters["GB/s_best"] = static_cast<double>(kDramBytes) / t.best / 1e9;
  st.SetLabel(std::to_string(threads) + "t");
}

// ---- dense matvec --------------------------------------------------------------------------

constexpr size_t kRows = 12288, kCols = 7168;

struct DenseData {
  std::vector<uint16_t> bf16;
  std::vector<float> f32;
  std::vector<float> x;
  std::vector<float> want_bf16, want_f32;  // scalar body's output
};

// Weights like a trained projection (|w| ~ 0.05), built as bf16 so both layouts hold equal values.
const DenseData& dense_data() {
  static const DenseData data = [] {
    DenseData d;
    uint32_t s = 12345;
    d.bf16.resize(kRows * kCols);
    for (auto& b : d.bf16) {
      const float v = (static_cast<float>(xorshift(s) >> 8) / 8388608.0f - 1.0f) * 0.05f;
      uint32_t bits;
      std::memcpy(&bits, &v, 4);
      b = static_cast<uint16_t>(bits >> 16);
    }
    d.f32.resize(d.bf16.size());
    for (size_t i = 0; i < d.bf16.size(); ++i) d.f32[i] = bf16_to_f32(d.bf16[i]);
    d.x.resize(kCols);
    for (auto& v : d.x) v = static_cast<float>(xorshift(s) >> 8) / 8388608.0f - 1.0f;
    const Isa saved = active_isa();
    set_active_isa(Isa::scalar);
    d.want_bf16.resize(kRows);
    d.want_f32.resize(kRows);
    matvec(Bf16Matrix{d.bf16, kRows, kCols}, d.x, d.want_bf16);
    matvec(F32Matrix{d.f32, kRows, kCols}, d.x, d.want_f32);
    set_active_isa(saved);
    return d;
  }();
  return data;
}

void BM_bf16_matvec(benchmark::State& st) {
  const Isa isa = static_cast<Isa>(st.range(0));
  const int threads = static_cast<int>(st.range(1));
  const DenseData& d = dense_data();
  std::vector<float> y(kRows);
  const Bf16Matrix w{d.bf16, kRows, kCols};
  const Timing timing = run_timed(st, isa, threads, [&] { matvec(w, d.x, y); });
  const bool exact = std::memcmp(y.data(), d.want_bf16.data(), kRows * sizeof(float)) == 0;
  set_rates(st, kRows * kCols * 2.0, 2.0 * kRows * kCols, timing, threads, exact);
  if (isa == best_isa() && threads == 2) keep_max(g_measured.bf16_gbs_2t, st.counters["GB/s_best"]);
}

void BM_f32_matvec(benchmark::State& st) {
  const Isa isa = static_cast<Isa>(st.range(0));
  const int threads = static_cast<int>(st.range(1));
  const DenseData& d = dense_data();
  std::vector<float> y(kRows);
  const F32Matrix w{d.f32, kRows, kCols};
  const Timing timing = run_timed(st, isa, threads, [&] { matvec(w, d.x, y); });
  const bool exact = std::memcmp(y.data(), d.want_f32.data(), kRows * sizeof(float)) == 0 &&
                     std::memcmp(y.data(), d.want_bf16.data(), kRows * sizeof(float)) == 0;
  set_rates(st, kRows * kCols * 4.0, 2.0 * kRows * kCols, timing, threads, exact);
}

// ---- a batch of rows: one matmul against B matvecs ---------------------------------------------

// B inputs against the bf16 matrix, as a batched decode step feeds every trunk projection: matmul
// over the B rows, and the same B rows as B matvecs, alternating inside each iteration so a
// neighbour's burst lands on both. vs_matvecs = the matmul's best time / the B matvecs' best: the
// share of B matvecs' time a batched projection costs (1 = no gain; 1/B = B rows for the price of
// one). bitexact: every row equal (memcmp) to its matvec.
// Wall seconds of one call of body inside arena.
template <class Body>
double seconds_in(tbb::task_arena& arena, Body& body) {
  const auto t0 = Clock::now();
  arena.execute(body);
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

void BM_bf16_batch(benchmark::State& st) {
  const Isa isa = static_cast<Isa>(st.range(0));
  const int threads = static_cast<int>(st.range(1));
  const auto B = static_cast<size_t>(st.range(2));
  const DenseData& d = dense_data();
  const Bf16Matrix w{d.bf16, kRows, kCols};
  std::vector<float> x(B * kCols);
  uint32_t s = 777;
  for (auto& v : x) v = static_cast<float>(xorshift(s) >> 8) / 8388608.0f - 1.0f;
  std::vector<float> y_mm(B * kRows), y_mv(B * kRows);
  auto batched = [&] { matmul(w, x, B, y_mm); };
  auto singles = [&] {
    for (size_t t = 0; t < B; ++t)
      matvec(w, std::span<const float>(x).subspan(t * kCols, kCols),
             std::span<float>(y_mv).subspan(t * kRows, kRows));
  };
  const Isa saved = active_isa();
  set_active_isa(isa);
  tbb::task_arena arena(threads);
  arena.execute(batched);  // warm
  auto timed = [&](auto& body) { return seconds_in(arena, body); };
  double best_mm = 1e30, best_mv = 1e30, sum_mm = 0.0;
  for (auto _ : st) {
    const double a = timed(batched), b = timed(singles);
    best_mm = a < best_mm ? a : best_mm;
    best_mv = b < best_mv ? b : best_mv;
    sum_mm += a;
  }
  set_active_isa(saved);
  st.SetLabel(std::string(isa_name(isa)) + " " + std::to_string(threads) + "t B=" + std::to_string(B));
  if (st.iterations() == 0) return;
  const double bytes = kRows * kCols * 2.0;  // the weights, read once per matmul
  st.counters["GB/s_best"] = bytes / best_mm / 1e9;
  st.counters["GFLOP/s"] = 2.0 * double(B) * kRows * kCols / (sum_mm / double(st.iterations())) / 1e9;
  st.counters["vs_matvecs"] = best_mm / best_mv;
  st.counters["bitexact"] = std::memcmp(y_mm.data(), y_mv.data(), y_mm.size() * sizeof(float)) == 0 ? 1 : 0;
}

// ---- the router over B rows ------------------------------------------------------------------

// One MoE layer's gate as the `wide` profile has it (512 experts x 2048, bf16: 2 MiB, L2-sized per
// task): route_rows over B rows against B single-row routes, alternating inside each iteration,
// every (row, top-k) index and weight checked equal. Any ISA: the single-row body is what every
// step used before the rows were batched (one gate pass per row).
void BM_router_rows(benchmark::State& st) {
  const Isa isa = static_cast<Isa>(st.range(0));
  const int threads = static_cast<int>(st.range(1));
  const auto B = static_cast<size_t>(st.range(2));
  constexpr size_t kExpertsR = 512, kHidden = 2048, kTop = 8;
  std::vector<uint16_t> g(kExpertsR * kHidden);
  std::vector<float> x(B * kHidden), bias(kExpertsR, 0.0f);
  uint32_t s = 99;
  for (auto& v : g) v = static_cast<uint16_t>(xorshift(s) >> 16) & 0xBCFF;  // |w| < 2^-2: unsaturated
  for (auto& v : x) v = static_cast<float>(xorshift(s) >> 8) / 8388608.0f - 1.0f;
  const Bf16Matrix gate{g, kExpertsR, kHidden};
  const RouterParams p{kTop, true, 1.0f};
  std::vector<float> sc_rows(B * kExpertsR), sc_one(kExpertsR), w_rows(B * kTop), w_one(B * kTop);
  std::vector<int32_t> i_rows(B * kTop), i_one(B * kTop);
  auto batched = [&] { route_rows(gate, x, B, bias, p, sc_rows, i_rows, w_rows); };
  auto singles = [&] {
    for (size_t t = 0; t < B; ++t)
      route(gate, std::span<const float>(x).subspan(t * kHidden, kHidden), bias, p, sc_one,
            std::span(i_one).subspan(t * kTop, kTop), std::span(w_one).subspan(t * kTop, kTop));
  };
  const Isa saved = active_isa();
  set_active_isa(isa);
  tbb::task_arena arena(threads);
  arena.execute(batched);  // warm
  auto timed = [&](auto& body) { return seconds_in(arena, body); };
  double best_rows = 1e30, best_one = 1e30, sum_rows = 0.0, sum_one = 0.0;
  for (auto _ : st) {
    const double a = timed(batched), b = timed(singles);
    best_rows = a < best_rows ? a : best_rows;
    best_one = b < best_one ? b : best_one;
    sum_rows += a;
    sum_one += b;
  }
  set_active_isa(saved);
  st.SetLabel(std::string(isa_name(isa)) + " " + std::to_string(threads) + "t B=" + std::to_string(B));
  if (st.iterations() == 0) return;
  const double n = double(st.iterations());
  st.counters["rows_us"] = sum_rows / n * 1e6;
  st.counters["singles_us"] = sum_one / n * 1e6;
  st.counters["vs_singles"] = best_rows / best_one;
  st.counters["bitexact"] =
      i_rows == i_one && std::memcmp(w_rows.data(), w_one.data(), w_one.size() * 4) == 0;
}

// ---- MXFP4 experts -------------------------------------------------------------------------

constexpr size_t kLatent = 3584, kInter = 3072;
constexpr size_t kExperts = 8;  // 8 x 17.5 MB = 140 MB streamed, > 4x the LLC

struct Mxfp4Mat {
  std::vector<uint8_t> packed, scales;
  size_t rows, cols;
  Mxfp4Matrix view() const { return Mxfp4Matrix{packed, scales, rows, cols}; }
};

Mxfp4Mat random_mxfp4(size_t rows, size_t cols, uint32_t& s) {
  Mxfp4Mat m{std::vector<uint8_t>(rows * mxfp4_packed_cols(cols)),
             std::vector<uint8_t>(rows * mxfp4_scale_cols(cols)), rows, cols};
  for (auto& b : m.packed) b = static_cast<uint8_t>(xorshift(s) >> 24);
  for (auto& b : m.scales) b = static_cast<uint8_t>(118 + xorshift(s) % 6);  // like the checkpoint
  return m;
}

struct Expert {
  Mxfp4Mat w1, w3, w2;
};

struct ExpertData {
  std::vector<Expert> experts;
  std::vector<float> z, h;                 // latent input, intermediate input of w2
  std::vector<float> want1, want3, want2;  // scalar body on expert 0
};

const ExpertData& expert_data() {
  static const ExpertData data = [] {
    ExpertData d;
    uint32_t s = 777;
    for (size_t e = 0; e < kExperts; ++e) {
      Expert ex{random_mxfp4(kInter, kLatent, s), random_mxfp4(kInter, kLatent, s),
                random_mxfp4(kLatent, kInter, s)};
      d.experts.push_back(std::move(ex));
    }
    d.z.resize(kLatent);
    d.h.resize(kInter);
    for (auto& v : d.z) v = static_cast<float>(xorshift(s) >> 8) / 8388608.0f - 1.0f;
    for (auto& v : d.h) v = static_cast<float>(xorshift(s) >> 8) / 8388608.0f - 1.0f;
    const Isa saved = active_isa();
    set_active_isa(Isa::scalar);
    d.want1.resize(kInter);
    d.want3.resize(kInter);
    d.want2.resize(kLatent);
    matvec(d.experts[0].w1.view(), d.z, d.want1);
    matvec(d.experts[0].w3.view(), d.z, d.want3);
    matvec(d.experts[0].w2.view(), d.h, d.want2);
    set_active_isa(saved);
    return d;
  }();
  return data;
}

// Bytes of one MXFP4 expert: 4 bits a weight (two per byte) + one scale byte per 32 weights; the
// counts are whole (kInter * kLatent is a multiple of 32).
constexpr size_t kExpertWeights = kInter * kLatent;
static_assert(kExpertWeights % 32 == 0);
constexpr double kExpertBytes = 3.0 * (double(kExpertWeights) / 2 + double(kExpertWeights) / 32);
constexpr double kExpertFlops = 3.0 * 2.0 * kInter * kLatent;

// One routed expert per iteration, cycling through experts so the weights come from DRAM.
void BM_mxfp4_expert(benchmark::State& st) {
  const Isa isa = static_cast<Isa>(st.range(0));
  const int threads = static_cast<int>(st.range(1));
  const ExpertData& d = expert_data();
  std::vector<float> y1(kInter), y3(kInter), y2(kLatent);
  size_t next = 0;
  const Timing timing = run_timed(st, isa, threads, [&] {
    const Expert& e = d.experts[next];
    next = (next + 1) % kExperts;
    matvec(e.w1.view(), d.z, y1);
    matvec(e.w3.view(), d.z, y3);
    matvec(e.w2.view(), d.h, y2);
  });
  // Bit check on expert 0.
  const Isa saved = active_isa();
  set_active_isa(isa);
  matvec(d.experts[0].w1.view(), d.z, y1);
  matvec(d.experts[0].w3.view(), d.z, y3);
  matvec(d.experts[0].w2.view(), d.h, y2);
  set_active_isa(saved);
  const bool exact = std::memcmp(y1.data(), d.want1.data(), kInter * 4) == 0 &&
                     std::memcmp(y3.data(), d.want3.data(), kInter * 4) == 0 &&
                     std::memcmp(y2.data(), d.want2.data(), kLatent * 4) == 0;
  set_rates(st, kExpertBytes, kExpertFlops, timing, threads, exact);
  if (isa == best_isa() && threads == 2) keep_max(g_measured.mxfp4_gbs_2t, st.counters["GB/s_best"]);
}

// The C reference's own benchmark shape: one w1 (3072x3584), hot in the LLC.
void BM_mxfp4_w1_hot(benchmark::State& st) {
  const Isa isa = static_cast<Isa>(st.range(0));
  const int threads = static_cast<int>(st.range(1));
  const ExpertData& d = expert_data();
  std::vector<float> y(kInter);
  const Mxfp4Matrix w = d.experts[0].w1.view();
  const Timing timing = run_timed(st, isa, threads, [&] { matvec(w, d.z, y); });
  const bool exact = std::memcmp(y.data(), d.want1.data(), kInter * 4) == 0;
  set_rates(st, kExpertBytes / 3.0, kExpertFlops / 3.0, timing, threads, exact);
}

// ---- KDA step ------------------------------------------------------------------------------

// One KDA layer's recurrence step for one token: 96 heads of D = 128 (state 6.3 MB, L3-resident
// between tokens). Heads are independent; the stage runs them in parallel, here they run serially.
void BM_kda_step(benchmark::State& st) {
  const Isa isa = static_cast<Isa>(st.range(0));
  constexpr size_t H = 96, D = 128;
  std::vector<float> S(H * D * D), alpha(H * D), k(H * D), v(H * D), q(H * D), o(H * D);
  uint32_t s = 4242;
  auto unit = [&] { return static_cast<float>(xorshift(s) >> 8) / 8388608.0f - 1.0f; };
  for (auto& x : S) x = unit();
  for (auto& x : alpha) x = 0.9f + 0.1f * unit();
  for (auto& x : k) x = unit() * 0.1f;
  for (auto& x : v) x = unit();
  for (auto& x : q) x = unit() * 0.1f;
  const Timing timing = run_timed(st, isa, 1, [&] {
    for (size_t h = 0; h < H; ++h) {
      kda_step(std::span<float>(S).subspan(h * D * D, D * D), std::span<const float>(alpha).subspan(h * D, D),
               std::span<const float>(k).subspan(h * D, D), std::span<const float>(v).subspan(h * D, D), 0.5f,
               std::span<const float>(q).subspan(h * D, D), std::span<float>(o).subspan(h * D, D), D);
    }
  });
  // Four passes over the state: decay, read, write, output; 2 flops per element each.
  st.counters["GFLOP/s"] = 4.0 * 2.0 * H * D * D / timing.mean / 1e9;
  st.counters["GB/s"] = 3.0 * 4.0 * H * D * D / timing.mean / 1e9;  // state read 4x, written 2x
}

void isa_thread_args(benchmark::internal::Benchmark* b) {
  for (Isa isa : supported_isas()) {
    for (int t = 1; t <= kMaxThreads; ++t) b->Args({static_cast<int64_t>(isa), t});
  }
}

}  // namespace

BENCHMARK(BM_dram_read)->Arg(1)->Arg(2)->MinTime(1.0)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_bf16_matvec)->Apply(isa_thread_args)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_f32_matvec)->Apply(isa_thread_args)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_bf16_batch)
    ->Apply([](benchmark::internal::Benchmark* b) {
      for (int t = 1; t <= kMaxThreads; ++t)
        for (int rows : {2, 4, 8}) b->Args({static_cast<int64_t>(best_isa()), t, rows});
    })
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK(BM_router_rows)
    ->Apply([](benchmark::internal::Benchmark* b) {
      for (Isa isa : supported_isas())
        for (int t = 1; t <= kMaxThreads; ++t)
          for (int rows : {1, 8}) b->Args({static_cast<int64_t>(isa), t, rows});
    })
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK(BM_mxfp4_expert)->Apply(isa_thread_args)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_mxfp4_w1_hot)->Apply(isa_thread_args)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_kda_step)
    ->Apply([](benchmark::internal::Benchmark* b) {
      for (Isa isa : supported_isas()) b->Arg(static_cast<int64_t>(isa));
    })
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// A second 2-thread DRAM pass after the kernels: the roofline is the better of the two, so a
// neighbour's burst during the first one cannot flatter the kernels.
BENCHMARK(BM_dram_read)
    ->Name("BM_dram_read_again")
    ->Arg(2)
    ->MinTime(1.0)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  const double dram = g_measured.dram_gbs[2];
  std::printf("dram_2t=%.2f GB/s bf16_2t=%.2f GB/s mxfp4_2t=%.2f GB/s (best iterations, %s)\n", dram,
              g_measured.bf16_gbs_2t, g_measured.mxfp4_gbs_2t, isa_name(best_isa()));
  std::printf("roofline bf16_2t=%.3f mxfp4_2t=%.3f\n", dram > 0 ? g_measured.bf16_gbs_2t / dram : 0.0,
              dram > 0 ? g_measured.mxfp4_gbs_2t / dram : 0.0);
  return 0;
}
