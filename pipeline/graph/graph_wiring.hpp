// The streaming graph's edges, as one table: every tbb::flow edge is a Wire (source node, named
// output port, target node, named input port), and the DOT description draws the same table, so the
// picture cannot drift from the graph. Impl::make_edges() makes an edge per Wire (its message types
// checked by make_edge at compile time); Impl::describe_edges() draws the Wires that carry messages
// under the run's strategy, with the slot pools' edges (PoolWire) where they belong.
#pragma once
#include <tuple>
#include <type_traits>

#include "pipeline/graph/graph.hpp"
#include "pipeline/graph/graph_messages.hpp"

namespace k3::pipeline::graph_detail {

// Strategies as a mask: which ones send messages on a wire (DOT draws it only then).
constexpr unsigned in(Strategy s) {
  return 1u << unsigned(s);
}
inline constexpr unsigned kLookaheadGraph = in(Strategy::lookahead) | in(Strategy::automatic);
inline constexpr unsigned kAll =
    in(Strategy::serial) | in(Strategy::trunk) | in(Strategy::overlap) | kLookaheadGraph;
inline constexpr unsigned kUndrawn = 0;

template <Node From, auto Out, Node To, auto In>
struct Wire {
  static_assert(port_of<Out>(From) && port_of<In>(To), "a port names another node's port");
  static constexpr Node from = From, to = To;
  static constexpr int out = std::is_same_v<decltype(Out), Whole> ? -1 : int(Out);
  const char* label = "";
  unsigned drawn = kAll;             // the strategies that send messages on it
  const char* wave_label = nullptr;  // its label under trunk / serial, when that differs
  unsigned trunks = kBothTrunks;     // the graphs that have it (graph_messages.hpp: kGraphs)
};
// An edge of the picture only: a slot pool (GraphDescription::add_pool) feeding a node.
struct PoolWire {
  const char* pool;
  Node to;
  const char* label;
  bool experts_only;  // the pool exists only for an MoE model
  unsigned trunks = kBothTrunks;
};

// In the picture's order (a DOT file lists edges as they come).
inline constexpr auto kWiring = std::tuple{
    PoolWire{"expert slots", kExpertFetch, "claim (LRU, pins)", true},
    // ---- trunk: schedule + free slots -> claim -> read -> bind ----
    Wire<kSchedule, whole, kTrunkClaim, ClaimIn::job>{"job"},
    Wire<kTrunkFree, whole, kTrunkClaim, ClaimIn::slot>{"free slot"},
    PoolWire{"trunk ring", kTrunkFree, "slot ids", false},
    PoolWire{"pinned trunk", kTrunkRead, "first touch", false, kRawTrunk},
    Wire<kTrunkClaim, whole, kTrunkRead, whole>{"(job, slot)"},
    Wire<kTrunkRead, whole, kTrunkBind, whole>{"landed", kAll, nullptr, kRawTrunk},
    // ---- compressed trunk: the stored layer is decoded into a decoded slot, in read order ----
    Wire<kTrunkRead, whole, kStoredOrder, whole>{"stored layer landed", kAll, nullptr, kCompressedTrunk},
    Wire<kStoredOrder, whole, kDecodeClaim, DecodeClaimIn::stored>{"in read order", kAll, nullptr,
                                                                   kCompressedTrunk},
    PoolWire{"decode slots", kDecodeFree, "slot ids", false, kCompressedTrunk},
    Wire<kDecodeFree, whole, kDecodeClaim, DecodeClaimIn::slot>{"free decoded slot", kAll, nullptr,
                                                                kCompressedTrunk},
    Wire<kDecodeClaim, whole, kTrunkDecode, whole>{"(stored, decoded slot)", kAll, nullptr, kCompressedTrunk},
    PoolWire{"pinned trunk", kTrunkDecode, "first touch: decoded into", false, kCompressedTrunk},
    Wire<kTrunkDecode, DecodeOut::ready, kTrunkBind, whole>{"decoded", kAll, nullptr, kCompressedTrunk},
    Wire<kTrunkDecode, DecodeOut::free_ring, kTrunkFree, whole>{"ring slot released", kAll, nullptr,
                                                                kCompressedTrunk},
    Wire<kTrunkDecode, DecodeOut::free_decoded, kDecodeFree, whole>{"unused (a pin)", kAll, nullptr,
                                                                    kCompressedTrunk},
    Wire<kTrunkBind, TrunkBindOut::ready, kLayerGate, LayerGateIn::ready>{"weights ready"},
    // ---- a layer runs when its weights and the previous layer's output are both there ----
    Wire<kLayerGate, whole, kAttention, whole>{"visit"},
    Wire<kAttention, AttentionOut::moe, kRouter, whole>{"moe"},
    Wire<kAttention, AttentionOut::dense, kDenseFfn, whole>{"dense"},
    Wire<kDenseFfn, DenseOut::done, kLayerDone, whole>{},
    // ---- MoE: route, fetch (cache, reads), land, latent + shared, experts, combine ----
    Wire<kRouter, RouterOut::fetch, kExpertFetch, whole>{"route", kAll & ~in(Strategy::serial)},
    Wire<kRouter, RouterOut::shared, kShared, whole>{"", kAll & ~in(Strategy::trunk)},
    Wire<kExpertFetch, FetchOut::misses, kExpertRead, whole>{"misses, by offset"},
    Wire<kExpertFetch, FetchOut::hits, kExpertLanded, whole>{"hits"},
    Wire<kExpertFetch, FetchOut::lookahead, kLookahead, whole>{"", kLookaheadGraph},
    Wire<kExpertRead, whole, kExpertLanded, whole>{"landed"},
    Wire<kExpertLanded, LandedOut::go, kExpertJoin, ExpertJoinIn::expert>{"expert landed", kAll,
                                                                          "wave landed"},
    Wire<kExpertLanded, LandedOut::shared, kShared, whole>{"first wave", in(Strategy::trunk)},
    Wire<kExpertLanded, LandedOut::retry, kExpertFetch, whole>{"retry"},
    Wire<kShared, SharedOut::latent, kExpertJoin, ExpertJoinIn::latent>{"latent ready"},
    Wire<kShared, SharedOut::fetch, kExpertFetch, whole>{"then read", in(Strategy::serial)},
    Wire<kShared, SharedOut::last_piece, kCombine, whole>{"last piece", kAll, nullptr, kOneProcess},
    Wire<kShared, SharedOut::last_piece, kExchange, whole>{"last piece", kAll, nullptr, kRanks},
    Wire<kExpertJoin, whole, kExpertCompute, whole>{},
    Wire<kExpertCompute, ComputeOut::retry, kExpertFetch, whole>{"retry (slot freed)"},
    Wire<kExpertCompute, ComputeOut::last_piece, kCombine, whole>{"last piece", kAll, nullptr, kOneProcess},
    Wire<kExpertCompute, ComputeOut::last_piece, kExchange, whole>{"last piece", kAll, nullptr, kRanks},
    Wire<kLookahead, LookaheadOut::prefetch, kExpertRead, whole>{"prefetch", kLookaheadGraph},
    Wire<kLookahead, LookaheadOut::last_piece, kCombine, whole>{"last piece", kLookaheadGraph, nullptr,
                                                                kOneProcess},
    Wire<kLookahead, LookaheadOut::last_piece, kExchange, whole>{"last piece", kLookaheadGraph, nullptr,
                                                                 kRanks},
    // ---- one rank of several: its experts' rows out, every other rank's in, before the combine ----
    PoolWire{"exchange buffers", kExchange, "send + receive", true, kRanks},
    Wire<kExchange, ExchangeOut::done, kCombine, whole>{"every rank's rows", kAll, nullptr, kRanks},
    Wire<kCombine, CombineOut::done, kLayerDone, whole>{},
    // ---- the layer is done: its ring slot goes back to the free list, the next layer may run ----
    // (compressed: the ring slot(s) a fused-decode layer held)
    Wire<kLayerDone, LayerDoneOut::free_slot, kTrunkFree, whole>{"slot released", kAll, nullptr},
    Wire<kLayerDone, LayerDoneOut::free_decoded, kDecodeFree, whole>{"decoded slot released", kAll, nullptr,
                                                                     kCompressedTrunk},
    Wire<kLayerDone, LayerDoneOut::next_layer, kLayerGate, LayerGateIn::go>{"next visit"},
    Wire<kLayerDone, LayerDoneOut::head, kHead, whole>{"last layer"},
    Wire<kLayerDone, LayerDoneOut::schedule, kSchedule, whole>{"next read", in(Strategy::serial)},
    // serial's next layer when it is pinned (its first read, or bound already): the picture shows
    // both as "next read" above
    Wire<kLayerDone, LayerDoneOut::claim_pin, kTrunkRead, whole>{"", kUndrawn},
    Wire<kLayerDone, LayerDoneOut::pin_ready, kLayerGate, LayerGateIn::ready>{"", kUndrawn},
};

}  // namespace k3::pipeline::graph_detail

namespace k3::pipeline::graph_detail {

// How many wires leave node n's output port `out` (-1: the node's only output) in the graphs
// `trunks` (a wire counts when it is in any of them).
constexpr int wires_from(Node n, int out, unsigned trunks = kBothTrunks) {
  return std::apply(
      [&](const auto&... w) {
        return (0 + ... + [&](const auto& x) {
          if constexpr (std::is_same_v<std::decay_t<decltype(x)>, PoolWire>)
            return 0;
          else
            return int(x.from == n && x.out == out && (x.trunks & trunks) != 0);
        }(w));
      },
      kWiring);
}

}  // namespace k3::pipeline::graph_detail
