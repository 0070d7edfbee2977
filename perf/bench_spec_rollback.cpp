// The two ways to undo a speculative verify pass's rejected rows in the KDA layers
// (docs/speculative.md), on the peer checkpoint's shape: 19 KDA layers of 32 heads x D = 128,
// ShortConv kernel 4; a pass of k + 1 = 9 rows (--spec 8).
//   (a) journal the whole layer state after every row (kper floats x rows); undo = one copy back;
//   (b) snapshot the state before the pass and keep each row's recurrence inputs (7P + H floats);
//       undo = copy back + replay the kept rows' recurrence (stages::kda_rollback, no weights).
// The engine uses (b). Run: build/perf/bench_spec_rollback
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "io/config.hpp"
#include "stages/kda.hpp"

namespace {

constexpr size_t kLayers = 19, kRows = 9;

k3::io::ModelConfig peer_shape() {
  k3::io::ModelConfig c;
  c.hidden = 4096;
  c.kda_heads = 32;
  c.kda_head_dim = 128;
  c.conv_kernel = 4;
  return c;
}

struct Layers {
  k3::io::ModelConfig c = peer_shape();
  size_t kper = k3::stages::kda_state_floats(c), rf = k3::stages::kda_journal_row_floats(c);
  std::vector<std::vector<float>> state, before, rows, per_row;  // per layer
  Layers() {
    for (size_t l = 0; l < kLayers; ++l) {
      state.emplace_back(kper, 0.01f);
      before.emplace_back(kper, 0.01f);
      rows.emplace_back(kRows * rf, 0.5f);
      per_row.emplace_back(kRows * kper, 0.0f);
    }
  }
};

Layers& layers() {
  static Layers L;
  return L;
}

// (a) during the pass: the state copied out after each row.
void BM_a_journal_pass(benchmark::State& st) {
  Layers& L = layers();
  for (auto _ : st)
    for (size_t l = 0; l < kLayers; ++l)
      for (size_t r = 0; r < kRows; ++r)
        std::memcpy(L.per_row[l].data() + r * L.kper, L.state[l].data(), 4 * L.kper);
  st.counters["journal_MiB"] = double(kLayers * kRows * L.kper * 4) / (1 << 20);
}

// (a) undo: the kept row's state copied back.
void BM_a_rollback(benchmark::State& st) {
  Layers& L = layers();
  for (auto _ : st)
    for (size_t l = 0; l < kLayers; ++l) std::memcpy(L.state[l].data(), L.per_row[l].data(), 4 * L.kper);
}

// (b) during the pass: the state on entry and every row's recurrence inputs.
void BM_b_journal_pass(benchmark::State& st) {
  Layers& L = layers();
  for (auto _ : st)
    for (size_t l = 0; l < kLayers; ++l) {
      std::memcpy(L.before[l].data(), L.state[l].data(), 4 * L.kper);
      std::memcpy(L.rows[l].data(), L.per_row[l].data(), 4 * kRows * L.rf);
    }
  st.counters["journal_MiB"] = double(kLayers * (L.kper + kRows * L.rf) * 4) / (1 << 20);
}

// (b) undo: restore + replay `keep` rows (stages::kda_rollback, the engine's code).
void BM_b_rollback(benchmark::State& st) {
  Layers& L = layers();
  const size_t keep = size_t(st.range(0));
  for (auto _ : st)
    for (size_t l = 0; l < kLayers; ++l) {
      const k3::stages::KdaJournal j{
          .before = L.before[l], .rows = L.rows[l], .capacity_rows = kRows, .used_rows = kRows};
      k3::stages::kda_rollback(L.c, k3::stages::kda_state_view(L.c, L.state[l]), j, keep);
    }
}

}  // namespace

BENCHMARK(BM_a_journal_pass)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_a_rollback)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_b_journal_pass)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_b_rollback)->Arg(1)->Arg(4)->Arg(8)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_MAIN();
