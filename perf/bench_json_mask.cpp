// Per-token cost of JSON-constrained sampling (stages/json_constraint.hpp) on a real BPE
// vocabulary cut to K3's size: the first 163,840 ranks of o200k_base (the real Kimi vocabulary is
// not in the repository). Run from the source tree, or pass --ranks FILE:
//
//   build/perf/bench_json_mask [--ranks fixtures/tokenizer/o200k_base.tiktoken] [benchmark flags]
//
// BM_mask_fresh: the mask computed from scratch in a given automaton state (the first visit of a
// state); BM_mask_cached: the same state again (a cache hit); BM_sampler_greedy: one greedy
// Sampler::next over the row with and without the mask (the mask's share of a sampled token).
#include <benchmark/benchmark.h>

#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "io/text/tokenizer.hpp"
#include "stages/json_constraint.hpp"
#include "stages/json_schema.hpp"
#include "stages/sampler.hpp"

namespace {

using namespace k3::stages;

constexpr int32_t kVocab = 163840;
std::string g_ranks = "fixtures/tokenizer/o200k_base.tiktoken";

std::shared_ptr<const TokenTable> table() {
  static const std::shared_ptr<const TokenTable> t = [] {
    const auto tok = k3::io::text::Tokenizer::load_vocab(g_ranks, k3::io::text::Pattern::o200k);
    std::vector<std::string> bytes(kVocab);
    for (int32_t id = 0; id < kVocab && id < tok.n_ids(); ++id) bytes[size_t(id)] = tok.token_bytes(id);
    // One end id past the ranks, as a real vocabulary has its specials there.
    bytes.back() = "<|end|>";
    std::vector<bool> special(kVocab, false);
    special.back() = true;
    return std::make_shared<const TokenTable>(std::move(bytes), std::move(special),
                                              std::vector<int32_t>{kVocab - 1});
  }();
  return t;
}

std::shared_ptr<const JsonSchema> schema() {
  static const auto s = std::make_shared<const JsonSchema>(compile_json_schema(
      R"({"type":"object","properties":{"name":{"type":"string"},"age":{"type":"integer"},
          "tags":{"type":"array","items":{"type":"string"}}},"required":["name","age"]})",
      "bench"));
  return s;
}

// The automaton states measured, as the text written so far.
const char* const kStates[] = {
    "",                                    // the value's start: only '{' and whitespace
    R"({"name":"Ada Lov)",                 // inside a string: most of the vocabulary
    R"({"name":"Ada","age":3)",            // inside a number
    R"({"name":"Ada","age":36,"tags":[)",  // an array's start
};

JsonConstraint at_state(int i) {
  JsonConstraint c(schema(), table());
  if (!c.feed(kStates[i])) std::abort();
  return c;
}

void BM_mask_fresh(benchmark::State& st) {
  const JsonConstraint start = at_state(int(st.range(0)));
  size_t allowed = 0;
  for (auto _ : st) {
    JsonConstraint c = start;  // an empty cache
    const std::span<const uint64_t> bits = c.allowed(kVocab);
    allowed = 0;
    for (uint64_t w : bits) allowed += size_t(__builtin_popcountll(w));
    benchmark::DoNotOptimize(allowed);
  }
  st.SetLabel(std::string("after '") + kStates[st.range(0)] + "': " + std::to_string(allowed) +
              " ids allowed");
}
BENCHMARK(BM_mask_fresh)->DenseRange(0, 3)->Unit(benchmark::kMillisecond);

void BM_mask_cached(benchmark::State& st) {
  JsonConstraint c = at_state(int(st.range(0)));
  c.allowed(kVocab);
  for (auto _ : st) benchmark::DoNotOptimize(c.allowed(kVocab).data());
}
BENCHMARK(BM_mask_cached)->DenseRange(0, 3)->Unit(benchmark::kMicrosecond);

void BM_sampler_greedy(benchmark::State& st) {
  const bool masked = st.range(0) != 0;
  std::mt19937 g(1);
  std::normal_distribution<float> d(0, 4);
  std::vector<float> logits(kVocab);
  for (float& x : logits) x = d(g);
  const JsonConstraint start = at_state(1);
  for (auto _ : st) {
    st.PauseTiming();
    Sampler s(SamplerOptions{});
    if (masked) s.set_constraint(std::make_unique<JsonConstraint>(start));  // fresh: no cache
    st.ResumeTiming();
    benchmark::DoNotOptimize(s.next(logits, {}));
  }
  st.SetLabel(masked ? "mask computed (state inside a string)" : "no constraint");
}
BENCHMARK(BM_sampler_greedy)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond);

}  // namespace

int main(int argc, char** argv) {
  std::vector<char*> rest;
  for (int i = 0; i < argc; ++i) {
    if (std::strcmp(argv[i], "--ranks") == 0 && i + 1 < argc)
      g_ranks = argv[++i];
    else
      rest.push_back(argv[i]);
  }
  int n = int(rest.size());
  benchmark::Initialize(&n, rest.data());
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
