// Trunk codec speed and ratio (docs/codec.md): decode GB/s of OUTPUT (raw bf16 bytes) at 1 and 2
// threads (each thread its own half of the blocks), encode GB/s of input, ratio = stored / raw.
//
// Data sets, 64 MiB of bf16 each (larger than the LLC, so decode writes go to DRAM as they would
// into a layer buffer):
//   normal    N(0, 0.02) per tensor of 16 Mi values (an initialised model), Box-Muller normals;
//   laplace   Laplace with a per-row scale (rows of 4096, scale log-uniform in [0.003, 0.05]);
//   student3  Student-t (3 degrees of freedom) with per-row scales: heavy tails / outliers;
//   irwin     what `k3flow synth` writes: sums of 4 uniform bytes (bounded, ~1000 distinct values);
//   trunk     the first 64 MiB of layer 1 of the packed trunk given as --trunk=DIR (a directory
//             holding trunk.bin + trunk.json; this program's own flag, before Google Benchmark's);
//             skipped without it.
// No real K3 weights are available on this machine: every figure must be re-measured on them.
// Arguments of BM_decode / BM_encode: codec (1 exp4, 2 huff, 3 exp3), data set, block values, verify.
#include <benchmark/benchmark.h>
#include <tbb/blocked_range.h>
#include <tbb/global_control.h>
#include <tbb/parallel_for.h>

#include <bit>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "io/codec/codec.hpp"
#include "io/packed_trunk.hpp"
#include "kernels/dispatch.hpp"
#include "kernels/matmul.hpp"

namespace {

namespace codec = k3::io::codec;
constexpr size_t kValues = size_t(32) << 20;  // 64 MiB of bf16

enum Set { normal, laplace, student3, irwin, trunk, n_sets };
const char* set_name(int s) {
  static const char* names[] = {"normal", "laplace", "student3", "irwin", "trunk"};
  return names[s];
}

uint16_t to_bf16(float f) {  // round to nearest even, as a checkpoint converter would
  uint32_t b = std::bit_cast<uint32_t>(f);
  b += 0x7FFFu + ((b >> 16) & 1u);
  return uint16_t(b >> 16);
}

std::vector<std::byte> make_set(int s) {
  std::vector<uint16_t> v(kValues);
  std::mt19937_64 rng(1234 + uint64_t(s));
  std::normal_distribution<float> nd(0.f, 1.f);
  std::uniform_real_distribution<float> u01(0.f, 1.f);
  std::student_t_distribution<float> td(3.f);
  float scale = 0.02f;
  for (size_t i = 0; i < kValues; ++i) {
    if (i % 4096 == 0) scale = 0.003f * std::pow(0.05f / 0.003f, u01(rng));  // per-row, log-uniform
    float x = 0;
    switch (s) {
      case normal:
        x = nd(rng) * 0.02f;
        break;
      case laplace: {
        const float uu = u01(rng) - 0.5f;
        x = -scale * std::copysign(std::log1p(-2.f * std::fabs(uu)), uu);
        break;
      }
      case student3:
        x = td(rng) * scale;
        break;
      case irwin: {
        const uint64_t r = rng();
        int sum = 0;
        for (int k = 0; k < 4; ++k) sum += int((r >> (8 * k)) & 0xFF);
        x = (float(sum) - 510.f) / 147.8f * 0.02f;
        break;
      }
    }
    v[i] = to_bf16(x);
  }
  std::vector<std::byte> out(kValues * 2);
  std::memcpy(out.data(), v.data(), out.size());
  return out;
}

std::string g_trunk_dir;  // --trunk=DIR

std::vector<std::byte> trunk_set() {
  if (g_trunk_dir.empty()) return {};
  const auto t = k3::io::PackedTrunk::open(g_trunk_dir, -1, k3::io::File::Mode::buffered);
  const auto& L = t.layer(t.layers().size() > 1 ? 1 : 0);
  std::vector<std::byte> out(size_t(std::min<uint64_t>(L.nbytes, kValues * 2)));
  t.file().read_exact(L.file_off, out);
  return out;
}

double thread_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

const std::vector<std::byte>& raw_of(int s) {
  static std::map<int, std::vector<std::byte>> cache;
  auto it = cache.find(s);
  if (it == cache.end()) it = cache.emplace(s, s == trunk ? trunk_set() : make_set(s)).first;
  return it->second;
}

const std::vector<std::byte>& encoded_of(int c, int s, uint32_t bv) {
  static std::map<std::tuple<int, int, uint32_t>, std::vector<std::byte>> cache;
  auto key = std::tuple(c, s, bv);
  auto it = cache.find(key);
  if (it == cache.end())
    it = cache.emplace(key, codec::encode(raw_of(s), {.codec = codec::Codec(c), .block_values = bv})).first;
  return it->second;
}

void BM_decode(benchmark::State& st) {
  const int c = int(st.range(0)), s = int(st.range(1));
  const uint32_t bv = uint32_t(st.range(2));
  const bool verify = st.range(3) != 0;
  const auto& raw = raw_of(s);
  if (raw.empty()) {
    st.SkipWithError("no --trunk=DIR");
    return;
  }
  const auto& enc = encoded_of(c, s, bv);
  const auto stream = codec::Stream::parse(enc, "bench");
  static std::vector<std::byte> out;  // shared by the threads: disjoint halves
  if (st.thread_index() == 0) out.assign(raw.size(), std::byte{0});
  const uint32_t nb = stream.n_blocks(), per = (nb + uint32_t(st.threads()) - 1) / uint32_t(st.threads());
  const uint32_t first = std::min(nb, per * uint32_t(st.thread_index())), end = std::min(nb, first + per);
  const double cpu0 = thread_cpu_seconds();
  for (auto _ : st) {
    stream.decode_blocks(first, end, out, verify);
    benchmark::ClobberMemory();
  }
  const double cpu = thread_cpu_seconds() - cpu0;
  const uint64_t my_bytes = std::min<uint64_t>(raw.size(), uint64_t(end) * bv * 2) - uint64_t(first) * bv * 2;
  st.SetBytesProcessed(int64_t(st.iterations() * my_bytes));
  // Output bytes per second of this thread's own CPU time: the per-core rate, robust to a box
  // shared with other work (bytes_per_second is wall time, all threads together).
  st.counters["GBps_per_core"] =
      benchmark::Counter(double(st.iterations() * my_bytes) / cpu / 1e9, benchmark::Counter::kAvgThreads);
  st.counters["ratio"] =
      benchmark::Counter(double(enc.size()) / double(raw.size()), benchmark::Counter::kAvgThreads);
  if (st.thread_index() == 0) st.counters["bitexact"] = (out == raw) ? 1 : 0;
  st.SetLabel(std::string(codec::codec_name(codec::Codec(c))) + "/" + set_name(s) + "/" +
              k3::kernels::isa_name(k3::kernels::active_isa()));
}

void BM_encode(benchmark::State& st) {
  const int c = int(st.range(0)), s = int(st.range(1));
  const uint32_t bv = uint32_t(st.range(2));
  const auto& raw = raw_of(s);
  if (raw.empty()) {
    st.SkipWithError("no --trunk=DIR");
    return;
  }
  size_t stored = 0;
  const double cpu0 = thread_cpu_seconds();
  for (auto _ : st) stored = codec::encode(raw, {.codec = codec::Codec(c), .block_values = bv}).size();
  st.SetBytesProcessed(int64_t(st.iterations() * raw.size()));
  st.counters["GBps_per_core"] = double(st.iterations() * raw.size()) / (thread_cpu_seconds() - cpu0) / 1e9;
  st.counters["ratio"] = double(stored) / double(raw.size());
  st.SetLabel(std::string(codec::codec_name(codec::Codec(c))) + "/" + set_name(s));
}

// The exponent's empirical entropy, what a 3-bit-offset exp4 with exp4's escapes would store
// (estimate: 11 bits a value + 3 bytes per escape + 4 bytes a block; what judged the offset width
// before exp3 was built), and the built exp3's ratio (1 byte per escape, no positions).
void BM_exponent_stats(benchmark::State& st) {
  const int s = int(st.range(0));
  const auto& raw = raw_of(s);
  if (raw.empty()) {
    st.SkipWithError("no --trunk=DIR");
    return;
  }
  const size_t n = raw.size() / 2;
  double entropy = 0, est3 = 0, est4 = 0;
  for (auto _ : st) {
    std::vector<uint64_t> hist(256);
    for (size_t i = 0; i < n; ++i)
      ++hist[(uint16_t(raw[2 * i]) | uint16_t(uint16_t(raw[2 * i + 1]) << 8)) >> 7 & 0xFF];
    entropy = 0;
    for (uint64_t h : hist)
      if (h) entropy -= double(h) / double(n) * std::log2(double(h) / double(n));
    auto estimate = [&](int span, double bits) {
      double bytes = 0;
      for (size_t b0 = 0; b0 < n; b0 += 4096) {
        std::vector<uint32_t> bh(256);
        const size_t b1 = std::min(n, b0 + 4096);
        for (size_t i = b0; i < b1; ++i)
          ++bh[(uint16_t(raw[2 * i]) | uint16_t(uint16_t(raw[2 * i + 1]) << 8)) >> 7 & 0xFF];
        uint32_t best = 0;
        for (int base = 0; base + span <= 256; ++base) {
          uint32_t w = 0;
          for (int e = base; e < base + span; ++e) w += bh[size_t(e)];
          best = std::max(best, w);
        }
        bytes += double(b1 - b0) * bits / 8 + 3.0 * double(b1 - b0 - best) + 4 + 16;
      }
      return bytes / double(raw.size());
    };
    est3 = estimate(7, 11);
    est4 = estimate(15, 12);
  }
  st.counters["ratio_exp3"] = double(encoded_of(3, s, 4096).size()) / double(raw.size());
  st.counters["exp_entropy_bits"] = entropy;
  st.counters["ratio_exp3_est"] = est3;
  st.counters["ratio_exp4_est"] = est4;
  st.counters["ratio_entropy_bound"] = (8 + entropy) / 16;
  st.SetLabel(set_name(s));
}

double process_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

// The fused decode (docs/codec.md, "Fused decode"): y = W x over the data set as an 8192 x 4096 bf16
// matrix (64 MiB, larger than the LLC), on `threads` oneTBB threads, six ways:
//   0 plain:  Bf16Matrix over the decoded bytes (a raw trunk's matvec);
//   1 staged: decode the whole exp4 matrix (the decode stage), then the plain matvec (before fusion);
//   2 fused:  CodedBf16Matrix over the exp4 stream, decoded tile by tile inside the matvec;
//   3, 4:     1 and 2 over the exp3 stream (4: the fused exp3 body where the CPU has it,
//             docs/codec.md "Fused exp3 body");
//   5:        4 with the fused exp3 body switched off (the exp3 tile path).
// bytes_per_second = decoded matrix bytes per second of wall time; cpu_GBps = per second of the
// process's CPU time (all threads). All give the same bits (bitexact = 1). BM_matmul: the same for
// `tokens` inputs (a batched decode step), modes 0, 2, 4, 5.
void matmul_bench(benchmark::State& st, int s, int mode, int threads, size_t tokens) {
  const auto& raw = raw_of(s);
  if (raw.empty()) {
    st.SkipWithError("no --trunk=DIR");
    return;
  }
  const size_t cols = 4096, rows = raw.size() / 2 / cols;
  tbb::global_control gc(tbb::global_control::max_allowed_parallelism, size_t(threads));
  const auto& enc = encoded_of(mode >= 3 ? 3 : 1, s, 4096);
  const auto stream = codec::Stream::parse(enc, "bench");
  std::vector<uint16_t> w(rows * cols);
  std::memcpy(w.data(), raw.data(), w.size() * 2);
  std::vector<std::byte> staged(raw.size());
  std::vector<float> x(cols * tokens), y(rows * tokens), want(rows * tokens);
  for (size_t i = 0; i < x.size(); ++i) x[i] = float(i % 17) * 0.125f - 1.0f;
  namespace kn = k3::kernels;
  kn::matmul(kn::Bf16Matrix{w, rows, cols}, x, tokens, want);
  const kn::CodedBf16Matrix coded{.src = &stream, .first = 0, .rows = rows, .cols = cols};
  kn::set_exp3_direct(mode != 5);
  const double cpu0 = process_cpu_seconds();
  for (auto _ : st) {
    if (mode == 0) {
      kn::matmul(kn::Bf16Matrix{w, rows, cols}, x, tokens, y);
    } else if (tokens == 1 && (mode == 1 || mode == 3)) {
      tbb::parallel_for(tbb::blocked_range<uint32_t>(0, stream.n_blocks(), 16),
                        [&](const tbb::blocked_range<uint32_t>& b) {
                          stream.decode_blocks(b.begin(), b.end(), staged, false);
                        });
      kn::matvec(kn::Bf16Matrix{{reinterpret_cast<const uint16_t*>(staged.data()), rows * cols}, rows, cols},
                 x, y);
    } else {
      kn::matmul(coded, x, tokens, y);
    }
    benchmark::ClobberMemory();
  }
  kn::set_exp3_direct(true);
  const double cpu = process_cpu_seconds() - cpu0;
  const double bytes = double(st.iterations()) * double(rows * cols * 2);
  st.SetBytesProcessed(int64_t(bytes));
  st.counters["cpu_GBps"] = bytes / cpu / 1e9;
  st.counters["bitexact"] = std::memcmp(y.data(), want.data(), y.size() * 4) == 0 ? 1 : 0;
  static const char* modes[] = {"plain", "staged", "fused", "staged-exp3", "fused-exp3", "tile-exp3"};
  st.SetLabel(std::string(set_name(s)) + "/" + modes[mode] + "/" +
              k3::kernels::isa_name(k3::kernels::active_isa()));
}

void BM_matvec(benchmark::State& st) {
  matmul_bench(st, int(st.range(0)), int(st.range(1)), int(st.range(2)), 1);
}

void BM_matmul(benchmark::State& st) {
  matmul_bench(st, int(st.range(0)), int(st.range(1)), int(st.range(2)), size_t(st.range(3)));
}

void decode_args(benchmark::internal::Benchmark* b) {
  for (int s = 0; s < n_sets; ++s) {
    b->Args({1, s, 4096, 0});
    b->Args({2, s, 65536, 0});
    b->Args({3, s, 4096, 0});
  }
  b->Args({1, normal, 4096, 1});  // with block checks verified (the first read of a layer)
  b->Args({2, normal, 65536, 1});
  b->Args({3, normal, 4096, 1});
  for (int bv : {1024, 16384}) b->Args({3, normal, bv, 0});
  for (int bv : {1024, 16384}) b->Args({3, student3, bv, 0});
  for (int bv : {256, 1024, 16384}) b->Args({1, student3, bv, 0});
  for (int bv : {4096, 16384}) b->Args({2, student3, bv, 0});
}

BENCHMARK(BM_exponent_stats)->DenseRange(0, n_sets - 1)->Iterations(1)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_decode)
    ->Apply(decode_args)
    ->Threads(1)
    ->Threads(2)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_matvec)
    ->ArgsProduct({{normal, trunk}, {0, 1, 2, 3, 4, 5}, {1, 2}})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_matmul)
    ->ArgsProduct({{trunk}, {0, 2, 4, 5}, {1, 2}, {2, 4, 8}})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_encode)
    ->Args({1, student3, 4096})
    ->Args({2, student3, 65536})
    ->Args({1, trunk, 4096})
    ->Args({2, trunk, 65536})
    ->Args({3, student3, 4096})
    ->Args({3, trunk, 4096})
    ->Iterations(3)
    ->Unit(benchmark::kMillisecond);

}  // namespace

int main(int argc, char** argv) {
  // --trunk=DIR is this program's; the rest goes to Google Benchmark.
  int kept = 0;
  for (int i = 0; i < argc; ++i) {
    const std::string a = argv[i];
    if (i > 0 && a.starts_with("--trunk="))
      g_trunk_dir = a.substr(8);
    else
      argv[kept++] = argv[i];
  }
  argc = kept;
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
