#include "pipeline/graph/routing_trace.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <numeric>
#include <random>

#include "io/error.hpp"

namespace k3::pipeline {
namespace {

struct Run {  // consecutive pairs of one layer
  int32_t layer;
  uint64_t first, count;  // pair index, pairs
};

}  // namespace

RoutingTrace parse_routing_trace(std::span<const std::byte> bytes, const std::string& name,
                                 const RoutingTraceShape& reference) {
  auto fail = [&](uint64_t pair, const std::string& what) {
    return io::runtime_error(fmt::format("{}: offset {}: {}", name, pair * 8, what));
  };
  if (bytes.size() % 8 != 0)
    throw io::runtime_error(
        fmt::format("{}: offset {}: {} trailing bytes, not a whole (int32 layer, int32 "
                    "expert) pair",
                    name, bytes.size() / 8 * 8, bytes.size() % 8));
  const uint64_t n = bytes.size() / 8;
  if (n == 0) throw io::runtime_error(name + ": offset 0: empty routing trace");
  std::vector<int32_t> v(n * 2);
  std::memcpy(v.data(), bytes.data(), n * 8);  // little-endian hosts only, as the engine
  RoutingTrace t;
  // The engine's header, else the reference's shape: valid layer numbers [lo, hi], experts [0, E).
  uint64_t begin = 0;
  int32_t lo = 1, hi = reference.layers;
  t.n_experts = reference.experts;
  t.top_k = reference.top_k;
  if (v[0] == kRoutingHeaderTopK) {
    const char* field[] = {"top-k", "experts", "layers"};
    int32_t value[3];
    for (uint64_t i = 0; i < 3; ++i) {
      if (i >= n || v[2 * i] != kRoutingHeaderTopK - int32_t(i))
        throw fail(std::min(i, n), fmt::format("the engine's header has no {} pair (layer {})", field[i],
                                               kRoutingHeaderTopK - int32_t(i)));
      value[i] = v[2 * i + 1];
      if (value[i] < 1 || value[i] > kRoutingHeaderMax)
        throw fail(i, fmt::format("header {} {} out of range", field[i], value[i]));
    }
    if (value[0] > value[1])
      throw fail(0, fmt::format("header top-k {} exceeds its {} experts", value[0], value[1]));
    t.top_k = value[0];
    t.n_experts = value[1];
    lo = 0;
    hi = value[2] - 1;
    begin = 3;
    t.header = true;
    if (begin == n) throw fail(n, "the engine's header and no pair");
  }
  // Named in the errors: where the valid range comes from.
  const char* rule = t.header ? "the header's" : "a reference trace's (--layers, --experts)";
  t.pairs = n - begin;
  std::vector<Run> runs;
  for (uint64_t i = begin; i < n; ++i) {
    const int32_t layer = v[2 * i], expert = v[2 * i + 1];
    if (layer < lo || layer > hi)
      throw fail(i, fmt::format("layer {} out of range: {} layers are {}..{}", layer, rule, lo, hi));
    if (expert < 0 || expert >= t.n_experts)
      throw fail(i,
                 fmt::format("expert {} out of range: {} experts are 0..{}", expert, rule, t.n_experts - 1));
    if (runs.empty() || runs.back().layer != layer) runs.push_back(Run{layer, i, 0});
    ++runs.back().count;
  }
  // Passes: a layer smaller than the one before starts the next. Every pass visits the first
  // pass's layers with one count per layer.
  std::vector<std::pair<size_t, size_t>> passes;  // [first run, end run)
  for (size_t r = 0; r < runs.size(); ++r)
    if (r == 0 || runs[r].layer < runs[r - 1].layer) passes.emplace_back(r, r);
  for (size_t p = 0; p < passes.size(); ++p)
    passes[p].second = p + 1 < passes.size() ? passes[p + 1].first : runs.size();
  for (size_t r = passes[0].first; r < passes[0].second; ++r) t.layers.push_back(runs[r].layer);
  const uint64_t k = uint64_t(t.top_k);
  for (const auto& [a, b] : passes) {
    if (b - a != t.layers.size())
      throw fail(runs[a].first,
                 fmt::format("a pass visits {} layers, the first pass {}", b - a, t.layers.size()));
    for (size_t r = a; r < b; ++r) {
      if (runs[r].layer != t.layers[r - a])
        throw fail(runs[r].first, fmt::format("layer {} where the pass should visit layer {}", runs[r].layer,
                                              t.layers[r - a]));
      if (runs[r].count != runs[a].count)
        throw fail(runs[r].first, fmt::format("layer {} has {} pairs, layer {} of the same pass {}",
                                              runs[r].layer, runs[r].count, runs[a].layer, runs[a].count));
    }
    if (runs[a].count % k != 0)
      throw fail(runs[a].first, fmt::format("layer {} has {} pairs, not whole positions of top-{}",
                                            runs[a].layer, runs[a].count, k));
  }
  t.passes = passes.size();
  const size_t L = t.layers.size();
  // Layer visits; each position's top-k checked for repeated experts; the deduplicated positions.
  t.recorded.resize(n);  // indexed by pair, the header's pairs included (unused)
  for (uint64_t i = 0; i < n; ++i) t.recorded[i] = v[2 * i + 1];
  std::vector<int32_t> sorted(k);
  for (const auto& [a, b] : passes) {
    const uint64_t P = runs[a].count / k;
    for (size_t r = a; r < b; ++r) {
      t.groups.push_back(RoutingTrace::Group{int(r - a), uint32_t(runs[r].first), uint32_t(runs[r].count)});
      for (uint64_t p = 0; p < P; ++p) {
        const uint64_t first = runs[r].first + p * k;
        std::copy_n(t.recorded.begin() + int64_t(first), k, sorted.begin());
        std::sort(sorted.begin(), sorted.end());
        if (auto d = std::adjacent_find(sorted.begin(), sorted.end()); d != sorted.end()) {
          const auto at =
              std::find(t.recorded.begin() + int64_t(first), t.recorded.begin() + int64_t(first + k), *d);
          const auto again = std::find(at + 1, t.recorded.begin() + int64_t(first + k), *d);
          throw fail(
              uint64_t(again - t.recorded.begin()),
              fmt::format("expert {} twice in one position's top-{} at layer {}", *d, k, runs[r].layer));
        }
      }
    }
    // This pass as positions x layers x k, then kept whole or only past a repeated prefix.
    std::vector<int32_t> pass(P * L * k);
    for (size_t r = a; r < b; ++r)
      for (uint64_t p = 0; p < P; ++p)
        std::copy_n(t.recorded.begin() + int64_t(runs[r].first + p * k), k,
                    pass.begin() + int64_t((p * L + (r - a)) * k));
    const size_t have = t.experts.size();
    const bool repeats = pass.size() > have && std::equal(t.experts.begin(), t.experts.end(), pass.begin());
    t.experts.insert(t.experts.end(), pass.begin() + int64_t(repeats ? have : 0), pass.end());
  }
  return t;
}

RoutingTrace read_routing_trace(const std::filesystem::path& path, const RoutingTraceShape& reference) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw io::runtime_error(path.string() + ": cannot open the routing trace");
  std::vector<char> buf((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  if (f.bad()) throw io::runtime_error(path.string() + ": read failed");
  return parse_routing_trace(std::as_bytes(std::span(buf)), path.string(), reference);
}

RoutingTrace relabel_experts(const RoutingTrace& t, uint64_t seed) {
  RoutingTrace out = t;
  out.groups.clear();
  out.recorded.clear();
  std::mt19937_64 rng(seed);
  std::vector<int32_t> perm(size_t(t.n_experts));
  const size_t L = t.layers.size(), k = size_t(t.top_k);
  for (size_t l = 0; l < L; ++l) {
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    for (size_t p = 0; p < t.positions(); ++p)
      for (size_t j = 0; j < k; ++j) {
        int32_t& e = out.experts[(p * L + l) * k + j];
        e = perm[size_t(e)];
      }
  }
  return out;
}

RoutingTrace reverse_positions(const RoutingTrace& t) {
  RoutingTrace out = t;
  out.groups.clear();
  out.recorded.clear();
  const size_t row = t.layers.size() * size_t(t.top_k), P = t.positions();
  for (size_t p = 0; p < P; ++p)
    std::copy_n(t.experts.begin() + int64_t((P - 1 - p) * row), row, out.experts.begin() + int64_t(p * row));
  return out;
}

RoutingReplay::RoutingReplay(RoutingTrace trace, int n_experts)
    : trace_(std::move(trace)), n_experts_(n_experts) {
  if (trace_.positions() == 0) throw io::runtime_error("routing replay: the trace holds no position");
}

void RoutingReplay::apply(int layer, uint64_t first_position, std::span<int32_t> idx, int top_k) {
  if (size_t(layer) >= ordinal_.size()) ordinal_.resize(size_t(layer) + 1, -1);
  if (ordinal_[size_t(layer)] < 0) ordinal_[size_t(layer)] = next_ordinal_++;
  const size_t li = size_t(ordinal_[size_t(layer)]) % trace_.layers.size(), K = size_t(top_k);
  const size_t tk = size_t(trace_.top_k);
  std::vector<char> used(static_cast<size_t>(n_experts_), 0);
  for (size_t t = 0; t < idx.size() / K; ++t) {
    const std::span<const int32_t> src = trace_.at((first_position + t) % trace_.positions(), li);
    std::fill(used.begin(), used.end(), 0);
    for (size_t j = 0; j < K; ++j) {
      int64_t e = int64_t(src[j % tk]) * n_experts_ / trace_.n_experts + int64_t(j / tk);
      e %= n_experts_;
      while (used[size_t(e)]) e = (e + 1) % n_experts_;
      used[size_t(e)] = 1;
      idx[t * K + j] = int32_t(e);
    }
  }
}

RoutingTraceWriter::RoutingTraceWriter(std::filesystem::path path, int top_k, int n_experts, int n_layers)
    : path_(std::move(path)) {
  std::ofstream f(path_, std::ios::binary | std::ios::trunc);
  if (!f) throw io::usage_error("--routing-trace: cannot write " + path_.string());
  const int32_t header[6] = {kRoutingHeaderTopK,     top_k,   kRoutingHeaderTopK - 1, n_experts,
                             kRoutingHeaderTopK - 2, n_layers};
  f.write(reinterpret_cast<const char*>(header), sizeof header);
  f.flush();
  if (!f) throw io::runtime_error(path_.string() + ": write of the routing trace failed");
}

void RoutingTraceWriter::layer(int layer, std::span<const int32_t> idx) {
  std::lock_guard lk(mu_);
  for (int32_t e : idx) {
    pass_.push_back(layer);
    pass_.push_back(e);
  }
}

void RoutingTraceWriter::end_call() {
  std::lock_guard lk(mu_);
  if (pass_.empty()) return;
  std::ofstream f(path_, std::ios::binary | std::ios::app);
  f.write(reinterpret_cast<const char*>(pass_.data()), std::streamsize(pass_.size() * sizeof(int32_t)));
  f.flush();
  if (!f) throw io::runtime_error(path_.string() + ": write of the routing trace failed");
  pass_.clear();
}

}  // namespace k3::pipeline
