// Expert routing traces (docs/routing.md): little-endian int32 (layer, expert) pairs in the order
// the router chose them. A trace is a sequence of passes; a pass visits the MoE layers in increasing
// order (a smaller layer than the previous pair starts the next pass), and at each layer lists
// positions x top_k experts, position-major, the same number of positions at every layer.
//
// Two producers write it:
//   - the C reference engine (fixtures/expert_trace.bin): no header; it re-prefilled the whole
//     prefix every step, so its pass k repeats the positions of pass k-1 and adds one. Its shape is
//     not in the file: it is read as RoutingTraceShape says (Kimi K3's by default: MoE layers 1..92,
//     896 experts, top-16);
//   - `k3flow generate --routing-trace F`: a header of three pairs whose layer field is negative,
//     (-1, top_k), (-2, experts), (-3, layers: the model's, so layer numbers are 0..layers-1), then
//     one pass per forward call over the new positions only (the prompt, then one position per token).
// read_routing_trace() accepts both: a pass whose leading positions repeat every position seen so
// far (same experts in the same order) only adds the rest.
#pragma once
#include <cstdint>
#include <filesystem>
#include <mutex>
#include <span>
#include <string>
#include <vector>

namespace k3::pipeline {

// The first pair's layer field in the engine's header (top-k), then -2 (experts), -3 (layers).
inline constexpr int32_t kRoutingHeaderTopK = -1;
inline constexpr int32_t kRoutingHeaderMax = 1 << 20;  // a header value above this is refused

// What a header-less (reference) trace is read as: layer numbers 1..layers, expert ids
// 0..experts-1, top_k experts per position.
struct RoutingTraceShape {
  int layers = 92, experts = 896, top_k = 16;  // Kimi K3 (layer 0 is dense)
};

struct RoutingTrace {
  int top_k = 0;
  std::vector<int> layers;  // the MoE layer numbers, ascending, as in the file
  int n_experts = 0;        // the expert count of the header or of the reference shape
  bool header = false;      // written by the engine (its header read)
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
  uint64_t pairs = 0;             // (layer, expert) pairs in the file, the header's not counted
  uint64_t passes = 0;            // forward calls (the reference: one per generated token)

  size_t positions() const {
    return layers.empty() || top_k == 0 ? 0 : experts.size() / (layers.size() * size_t(top_k));
  }
  std::span<const int32_t> at(size_t position, size_t layer_index) const {
    return std::span(experts).subspan((position * layers.size() + layer_index) * size_t(top_k),
                                      size_t(top_k));
  }
};

// Throws io::Error (runtime) naming the file and the byte offset of the first bad pair. `reference`
// applies to a trace without the engine's header.
RoutingTrace parse_routing_trace(std::span<const std::byte> bytes, const std::string& name,
                                 const RoutingTraceShape& reference = {});
RoutingTrace read_routing_trace(const std::filesystem::path&, const RoutingTraceShape& reference = {});

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

// Writes the header, then appends the pairs of one forward call: `idx` holds positions x top_k
// experts of `layer`. RoutingTraceWriter collects a whole call (every layer) and writes it in the
// trace's order.
class RoutingTraceWriter {
 public:
  RoutingTraceWriter(std::filesystem::path path, int top_k, int n_experts, int n_layers);
  void layer(int layer, std::span<const int32_t> idx);  // one MoE layer of the call under way
  void end_call();                                      // writes the call's pass, flushed
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
  std::mutex mu_;  // layers are routed one after another, on whichever graph thread
  std::vector<int32_t> pass_;
};

}  // namespace k3::pipeline
