// Expert routing traces (docs/routing.md): little-endian int32 (layer, expert) pairs, no header, in
// the order the router chose them. A trace is a sequence of passes; a pass visits the MoE layers in
// increasing order (a smaller layer than the previous pair starts the next pass), and at each layer
// lists positions x top_k experts, position-major, the same number of positions at every layer.
//
// Two producers write it:
//   - the C reference engine (fixtures/expert_trace.bin) re-prefilled the whole prefix every step,
//     so its pass k repeats the positions of pass k-1 and adds one;
//   - `k3flow generate --routing-trace F`: one pass per forward call over the new positions only
//     (the prompt, then one position per token).
// read_routing_trace() accepts both: a pass whose leading positions repeat every position seen so
// far (same experts in the same order) only adds the rest. top_k is the greatest common divisor of
// the per-layer counts (16 on both K3 traces).
#pragma once
#include <cstdint>
#include <filesystem>
#include <mutex>
#include <span>
#include <string>
#include <vector>

namespace k3::pipeline {

struct RoutingTrace {
  int top_k = 0;
  std::vector<int> layers;  // the MoE layer numbers, ascending, as in the file
  int n_experts = 0;        // largest expert id + 1
  // Deduplicated: positions() x layers.size() x top_k expert ids, position-major.
  std::vector<int32_t> experts;
  // The file's layer visits in its own order (recorded order): every position of one pass at one
  // layer, `count` expert ids from `first` in `recorded`.
  struct Group {
    int layer_index = 0;
    uint32_t first = 0, count = 0;
  };
  std::vector<Group> groups;
  std::vector<int32_t> recorded;  // the file's expert ids
  uint64_t pairs = 0;             // pairs in the file
  uint64_t passes = 0;            // forward calls (the reference: one per generated token)

  size_t positions() const {
    return layers.empty() || top_k == 0 ? 0 : experts.size() / (layers.size() * size_t(top_k));
  }
  std::span<const int32_t> at(size_t position, size_t layer_index) const {
    return std::span(experts).subspan((position * layers.size() + layer_index) * size_t(top_k),
                                      size_t(top_k));
  }
};

// Throws io::Error (runtime) naming the file and the byte offset of the first bad pair.
RoutingTrace parse_routing_trace(std::span<const std::byte> bytes, const std::string& name);
RoutingTrace read_routing_trace(const std::filesystem::path&);

// Variants for robustness checks: each layer's expert ids relabelled by a random permutation (seeded),
// and the positions in reverse order. Both keep `recorded` consistent with `experts` only for
// incremental replay (the recorded groups are dropped).
RoutingTrace relabel_experts(const RoutingTrace&, uint64_t seed);
RoutingTrace reverse_positions(const RoutingTrace&);

// `bench --routing-replay`: the router's top-k replaced by a trace's, so the cache and prefetch can
// be timed under real locality on a synthetic checkpoint. Row t of a call that starts at position P
// takes the trace's position (P + t) mod positions, at the trace layer (this MoE layer's ordinal)
// mod layers; its first top_k experts scaled to the checkpoint's count (e x n_experts / the trace's),
// a collision moved to the next free id. The router's weights are kept: the logits are not the
// model's.
class RoutingReplay {
 public:
  RoutingReplay(RoutingTrace trace, int n_experts);
  void apply(int layer, uint64_t first_position, std::span<int32_t> idx, int top_k);

 private:
  RoutingTrace trace_;
  int n_experts_;
  std::vector<int> ordinal_;  // engine layer -> MoE ordinal, in the order first routed
  int next_ordinal_ = 0;
};

// Appends the pairs of one forward call: `idx` holds positions x top_k experts of `layer`.
// RoutingTraceWriter collects a whole call (every layer) and writes it in the trace's order.
class RoutingTraceWriter {
 public:
  explicit RoutingTraceWriter(std::filesystem::path path);
  void layer(int layer, std::span<const int32_t> idx);  // one MoE layer of the call under way
  void end_call();                                      // writes the call's pass, flushed
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
  std::mutex mu_;  // layers are routed one after another, on whichever graph thread
  std::vector<int32_t> pass_;
};

}  // namespace k3::pipeline
