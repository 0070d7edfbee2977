// What travels on the streaming graph's edges (graph.hpp): handles, never weights, each edge with a
// type of its own so the compiler checks what goes where; the node ids; and the named ports of every
// node with more than one.
//
// A Visit is (step, layer): one decode step (a forward call) at one layer. The graph never decodes
// it by arithmetic; the joins and the trunk slots' holders need one integer per visit, and
// visit_key() is the only place that makes it (step * n_layers + layer, as slot_pool.hpp records it).
#pragma once
#include <cstddef>
#include <cstdint>
#include <tuple>
#include <type_traits>
#include <vector>

namespace k3::pipeline::graph_detail {

struct Visit {
  uint64_t step = 0;  // the forward call (decode step), counted from 0
  int layer = 0;
  Visit next() const { return Visit{step, layer + 1}; }
};

inline uint64_t visit_key(Visit v, int n_layers) {
  return v.step * uint64_t(n_layers) + uint64_t(v.layer);
}
// expert_join's key: a visit and one of its expert groups (groups < 65536: n_experts is capped there).
inline uint64_t group_key(Visit v, int group, int n_layers) {
  return (visit_key(v, n_layers) << 16) | uint64_t(group);
}

// A trunk slot: a ring slot, or (pin()) the layer's pinned region.
struct SlotRef {
  int index = -1;
  static constexpr SlotRef pin() { return SlotRef{-1}; }
  bool pinned() const { return index < 0; }
};

// ---- trunk ----
struct TrunkJob {  // read this visit's layer (the spanning layer is `ring_slots` parts, one slot each)
  Visit visit;
  int part = 0;
};
using TrunkClaim = std::tuple<TrunkJob, SlotRef>;  // a job that met a free slot (or a pin's first read)
struct TrunkReady {                                // the layer's weights are bound in `slot`
  Visit visit;
  SlotRef slot;
  // compressed trunk: trunk_read's submission order (0, 1, ...), which stored_order restores so
  // that layers are decoded in the order they are read, which is the order they are computed
  uint64_t seq = 0;
};
struct DecodeSlot {  // a decoded slot of a compressed trunk (TrunkSlots::decode_slots)
  int index = 0;
};
using DecodeClaim = std::tuple<TrunkReady, DecodeSlot>;  // a stored layer landed, and a free decoded slot

// ---- one message type per meaning: a visit and the tag of the edge it travels ----
template <class Tag>
struct VisitMsg {
  Visit visit;
};
using LayerGo = VisitMsg<struct LayerGoTag>;          // the hidden state is ready for this visit
using DenseGo = VisitMsg<struct DenseGoTag>;          // attention done, the layer's FFN is dense
using RouteGo = VisitMsg<struct RouteGoTag>;          // attention done, the layer's FFN is MoE
using SharedGo = VisitMsg<struct SharedGoTag>;        // compute the latent z and the shared experts
using FetchGo = VisitMsg<struct FetchGoTag>;          // claim (more of) the layer's routed experts
using LookaheadGo = VisitMsg<struct LookaheadGoTag>;  // predict and prefetch the next layer's experts
using PieceDone = VisitMsg<struct PieceDoneTag>;      // the MoE layer's last piece is done: combine
using LayerDone = VisitMsg<struct LayerDoneTag>;      // the layer's output is in the hidden state
using HeadGo = VisitMsg<struct HeadGoTag>;            // the last layer is done: run the head

// ---- experts ----
struct ReadItem {
  Visit visit;  // the layer that claimed the slot (for a prefetch: the layer that predicted it)
  int slot, layer, expert;
  bool prefetch;
};
struct ReadBatch {
  std::vector<ReadItem> items;
};
struct ExpertLanded {
  Visit visit;
  int slot;
  int group;  // for a hit; a read's group comes back from the cache
  bool read, ok;
};
struct ExpertGo {  // an expert group's weights are bound in `slot`
  Visit visit;
  int group, slot;
};
struct LatentGo {  // the latent z the group's rows need is computed
  Visit visit;
  int group;
};

// Which graphs have a node or an edge, one bit per graph the engine builds: by trunk, the raw one or
// the compressed one (with the decode stage: trunk_read -> stored_order -> decode_claim ->
// trunk_decode -> trunk_bind); by process, one process alone or one rank of several (expert parallel,
// docs/distributed.md §6: the MoE layer's last piece goes to expert_exchange, then to combine).
inline constexpr unsigned kRawOne = 1, kCompressedOne = 2, kRawRanks = 4, kCompressedRanks = 8;
inline constexpr unsigned kRawTrunk = kRawOne | kRawRanks,
                          kCompressedTrunk = kCompressedOne | kCompressedRanks,
                          kBothTrunks = kRawTrunk | kCompressedTrunk;
inline constexpr unsigned kOneProcess = kRawOne | kCompressedOne, kRanks = kRawRanks | kCompressedRanks;
inline constexpr unsigned kGraphs[] = {kRawOne, kCompressedOne, kRawRanks, kCompressedRanks};

// ---- nodes: their ids, in the order of the diagram in graph.hpp; everything else about a node (its
// type, body, name, concurrency) is its row of kNodeTable (graph_nodes.hpp), in the same order ----
enum Node : int {
  kSchedule,
  kTrunkFree,
  kTrunkClaim,
  kTrunkRead,
  kStoredOrder,
  kDecodeFree,
  kDecodeClaim,
  kTrunkDecode,
  kTrunkBind,
  kLayerGate,
  kAttention,
  kDenseFfn,
  kRouter,
  kExpertFetch,
  kExpertRead,
  kExpertLanded,
  kShared,
  kExpertJoin,
  kExpertCompute,
  kLookahead,
  kExchange,
  kCombine,
  kLayerDone,
  kHead,
  kNodeCount
};

// ---- ports, by name: a node's single port (or a node that is not a multi-port one) is `whole` ----
enum class Whole { node };
inline constexpr Whole whole = Whole::node;
enum class ClaimIn { job, slot };
enum class LayerGateIn { go, ready };
enum class ExpertJoinIn { expert, latent };
enum class DecodeClaimIn { stored, slot };
enum class DecodeOut { ready, free_ring, free_decoded };
enum class TrunkBindOut { ready };
enum class AttentionOut { moe, dense };
enum class DenseOut { done };
enum class RouterOut { fetch, shared };
enum class FetchOut { misses, hits, lookahead };
enum class LandedOut { go, shared, retry };
enum class SharedOut { latent, fetch, last_piece };
enum class ComputeOut { retry, last_piece };
enum class LookaheadOut { prefetch, last_piece };
enum class ExchangeOut { done };
enum class CombineOut { done };
enum class LayerDoneOut { free_slot, next_layer, head, schedule, claim_pin, pin_ready, free_decoded };

// Whose port each is: the wiring table (graph_wiring.hpp) checks a port belongs to its node.
constexpr Node owner(ClaimIn) {
  return kTrunkClaim;
}
constexpr Node owner(LayerGateIn) {
  return kLayerGate;
}
constexpr Node owner(ExpertJoinIn) {
  return kExpertJoin;
}
constexpr Node owner(DecodeClaimIn) {
  return kDecodeClaim;
}
constexpr Node owner(DecodeOut) {
  return kTrunkDecode;
}
constexpr Node owner(TrunkBindOut) {
  return kTrunkBind;
}
constexpr Node owner(AttentionOut) {
  return kAttention;
}
constexpr Node owner(DenseOut) {
  return kDenseFfn;
}
constexpr Node owner(RouterOut) {
  return kRouter;
}
constexpr Node owner(FetchOut) {
  return kExpertFetch;
}
constexpr Node owner(LandedOut) {
  return kExpertLanded;
}
constexpr Node owner(SharedOut) {
  return kShared;
}
constexpr Node owner(ComputeOut) {
  return kExpertCompute;
}
constexpr Node owner(LookaheadOut) {
  return kLookahead;
}
constexpr Node owner(ExchangeOut) {
  return kExchange;
}
constexpr Node owner(CombineOut) {
  return kCombine;
}
constexpr Node owner(LayerDoneOut) {
  return kLayerDone;
}
template <auto P>
constexpr bool port_of(Node n) {
  if constexpr (std::is_same_v<decltype(P), Whole>)
    return true;
  else
    return owner(P) == n;
}

// A node body's output port by name: port<AttentionOut::moe>(out).try_put(...).
template <auto P, class Outputs>
auto& port(Outputs& out) {
  return std::get<size_t(P)>(out);
}

}  // namespace k3::pipeline::graph_detail
