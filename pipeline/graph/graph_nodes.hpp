// The streaming graph's nodes, as one table: a row per node, in Node's order (graph_messages.hpp),
// with its tbb type, what it shows in the DOT description and the trace (name, kind, concurrency,
// cluster, the graphs that have it), and its body. Impl::build() (graph.cpp) makes a node per row,
// as make_edges() makes an edge per Wire of graph_wiring.hpp; NodeType<N>, node_name() and the
// wiring's compile-time checks read the same table. A body is a member function of Impl
// (graph_nodes.cpp), which the row's lambda calls: the lambda takes the Impl first, so the table
// needs only the function's name here, before Impl is declared.
#pragma once
#include <tbb/flow_graph.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <tuple>
#include <type_traits>
#include <utility>

#include "pipeline/graph/graph_messages.hpp"

namespace k3::pipeline::graph_detail {

namespace flow = tbb::flow;

template <class In, class... Out>
using Multi = flow::multifunction_node<In, std::tuple<Out...>>;
using TrunkReadNode = flow::async_node<TrunkClaim, TrunkReady>;
using ExpertReadNode = flow::async_node<ReadBatch, ExpertLanded>;
using GatedLayer = std::tuple<LayerGo, TrunkReady>;  // layer_gate's output
using GatedExpert = std::tuple<ExpertGo, LatentGo>;  // expert_join's output

// What a node shows: its name (the DOT node and the trace row "node: <name>"), its tbb kind as text,
// its concurrency (1 serial, 0 unlimited), its DOT cluster, and the graphs that have it (kGraphs).
struct NodeInfo {
  const char* name;
  const char* kind;
  int concurrency;
  const char* cluster;
  unsigned graphs = kBothTrunks;  // kCompressedTrunk: the decode stage; kRanks: expert_exchange
};

// A node without a body: a queue, or a queueing join.
struct NoBody {};

// One row: node id, tbb type, what it shows, and its body, which build() gives the node's
// constructor with the Impl bound as its first argument:
//   multifunction_node, async_node: (impl, input, output ports or gateway);
//   function_node (the head): (impl, input) -> continue_msg;
//   sequencer_node: (impl, message) -> its sequence number;
//   join_node key_matching: a tuple of key functions, one per input port: (impl, message) -> key.
template <Node Id, class Type, class Body = NoBody>
struct NodeRow {
  static constexpr Node id = Id;
  using type = Type;
  using body_type = Body;
  NodeInfo info;
  Body body;
};
template <Node Id, class Type, class Body = NoBody>
constexpr NodeRow<Id, Type, Body> row(NodeInfo info, Body body = {}) {
  return {info, body};
}

// In Node's order, which is the order of the diagram in graph.hpp and of the DOT file's nodes.
inline constexpr auto kNodeTable = std::tuple{
    // ---- trunk io ----
    row<kSchedule, flow::queue_node<TrunkJob>>({"trunk_schedule", "queue_node", 0, "trunk io"}),
    row<kTrunkFree, flow::queue_node<SlotRef>>({"trunk_free", "queue_node (free list)", 0, "trunk io"}),
    row<kTrunkClaim, flow::join_node<TrunkClaim, flow::queueing>>(
        {"trunk_claim", "join_node queueing", 0, "trunk io"}),
    row<kTrunkRead, TrunkReadNode>({"trunk_read", "async_node (io_uring)", 1, "trunk io"},
                                   [](auto& m, const auto& in, auto& gw) { m.trunk_read_body(in, gw); }),
    row<kStoredOrder, flow::sequencer_node<TrunkReady>>(
        {"stored_order", "sequencer_node (read order)", 0, "trunk io", kCompressedTrunk},
        [](auto&, const TrunkReady& r) { return size_t(r.seq); }),
    row<kDecodeFree, flow::queue_node<DecodeSlot>>(
        {"decode_free", "queue_node (free list)", 0, "trunk io", kCompressedTrunk}),
    row<kDecodeClaim, flow::join_node<DecodeClaim, flow::queueing>>(
        {"decode_claim", "join_node queueing", 0, "trunk io", kCompressedTrunk}),
    row<kTrunkDecode, Multi<DecodeClaim, TrunkReady, SlotRef, DecodeSlot>>(
        {"trunk_decode", "multifunction_node (parallel_for over blocks)", 1, "trunk io", kCompressedTrunk},
        [](auto& m, const auto& in, auto& out) { m.trunk_decode_body(in, out); }),
    row<kTrunkBind, Multi<TrunkReady, TrunkReady>>(
        {"trunk_bind", "multifunction_node", 0, "trunk io"},
        [](auto& m, const auto& in, auto& out) { m.trunk_bind_body(in, out); }),
    // ---- layer ----
    row<kLayerGate, flow::join_node<GatedLayer, flow::key_matching<uint64_t>>>(
        {"layer_gate", "join_node key_matching (visit)", 0, "layer"},
        std::tuple{[](auto& m, const LayerGo& x) { return visit_key(x.visit, m.n_layers); },
                   [](auto& m, const TrunkReady& x) { return visit_key(x.visit, m.n_layers); }}),
    row<kAttention, Multi<GatedLayer, RouteGo, DenseGo>>(
        {"attention", "multifunction_node", 1, "layer"},
        [](auto& m, const auto& in, auto& out) { m.attention_body(in, out); }),
    row<kDenseFfn, Multi<DenseGo, LayerDone>>(
        {"dense_ffn", "multifunction_node", 1, "layer"},
        [](auto& m, const auto& in, auto& out) { m.dense_ffn_body(in, out); }),
    // ---- moe ----
    row<kRouter, Multi<RouteGo, FetchGo, SharedGo>>(
        {"router", "multifunction_node", 1, "moe"},
        [](auto& m, const auto& in, auto& out) { m.router_body(in, out); }),
    row<kExpertFetch, Multi<FetchGo, ReadBatch, ExpertLanded, LookaheadGo>>(
        {"expert_fetch", "multifunction_node", 1, "moe"},
        [](auto& m, const auto& in, auto& out) { m.expert_fetch_body(in, out); }),
    row<kExpertRead, ExpertReadNode>({"expert_read", "async_node (io_uring)", 1, "moe"},
                                     [](auto& m, const auto& in, auto& gw) { m.expert_read_body(in, gw); }),
    row<kExpertLanded, Multi<ExpertLanded, ExpertGo, SharedGo, FetchGo>>(
        {"expert_landed", "multifunction_node", 1, "moe"},
        [](auto& m, const auto& in, auto& out) { m.expert_landed_body(in, out); }),
    row<kShared, Multi<SharedGo, LatentGo, FetchGo, PieceDone>>(
        {"shared", "multifunction_node", 1, "moe"},
        [](auto& m, const auto& in, auto& out) { m.shared_body(in, out); }),
    row<kExpertJoin, flow::join_node<GatedExpert, flow::key_matching<uint64_t>>>(
        {"expert_join", "join_node key_matching (visit, expert)", 0, "moe"},
        std::tuple{[](auto& m, const ExpertGo& x) { return group_key(x.visit, x.group, m.n_layers); },
                   [](auto& m, const LatentGo& x) { return group_key(x.visit, x.group, m.n_layers); }}),
    row<kExpertCompute, Multi<GatedExpert, FetchGo, PieceDone>>(
        {"expert_compute", "multifunction_node", 0, "moe"},
        [](auto& m, const auto& in, auto& out) { m.expert_compute_body(in, out); }),
    row<kLookahead, Multi<LookaheadGo, ReadBatch, PieceDone>>(
        {"lookahead", "multifunction_node", 1, "moe"},
        [](auto& m, const auto& in, auto& out) { m.lookahead_body(in, out); }),
    row<kExchange, Multi<PieceDone, PieceDone>>(
        {"expert_exchange", "multifunction_node (allgatherv over the ranks)", 1, "moe", kRanks},
        [](auto& m, const auto& in, auto& out) { m.exchange_body(in, out); }),
    row<kCombine, Multi<PieceDone, LayerDone>>(
        {"combine", "multifunction_node", 1, "moe"},
        [](auto& m, const auto& in, auto& out) { m.combine_body(in, out); }),
    // ---- the layer is done; the head ----
    row<kLayerDone, Multi<LayerDone, SlotRef, LayerGo, HeadGo, TrunkJob, TrunkClaim, TrunkReady, DecodeSlot>>(
        {"layer_done", "multifunction_node", 1, "layer"},
        [](auto& m, const auto& in, auto& out) { m.layer_done_body(in, out); }),
    row<kHead, flow::function_node<HeadGo>>({"head", "function_node", 1, "layer"},
                                            [](auto& m, const HeadGo& in) {
                                              m.head_body(in);
                                              return flow::continue_msg();
                                            }),
};

using NodeTable = std::remove_const_t<decltype(kNodeTable)>;
static_assert(std::tuple_size_v<NodeTable> == kNodeCount, "kNodeTable: a row per Node");
template <size_t... I>
constexpr bool rows_in_id_order(std::index_sequence<I...>) {
  return ((std::tuple_element_t<I, NodeTable>::id == Node(I)) && ...);
}
static_assert(rows_in_id_order(std::make_index_sequence<kNodeCount>{}), "kNodeTable is in Node's order");

// The node types, indexed by Node: Impl::node<kAttention>() is the attention node, and make_edge over
// the wiring table (graph_wiring.cpp) checks every edge's message type.
template <Node N>
using NodeType = typename std::tuple_element_t<N, NodeTable>::type;
template <Node N>
using Outputs = typename NodeType<N>::output_ports_type;

// Every node, owned: a unique_ptr per row (null for a node the run's graph does not have).
template <class Table>
struct Owned;
template <class... Row>
struct Owned<std::tuple<Row...>> {
  using type = std::tuple<std::unique_ptr<typename Row::type>...>;
};

inline constexpr std::array<NodeInfo, kNodeCount> kNodeInfo =
    std::apply([](const auto&... r) { return std::array<NodeInfo, kNodeCount>{r.info...}; }, kNodeTable);

constexpr const char* node_name(Node id) {
  return kNodeInfo[id].name;
}

}  // namespace k3::pipeline::graph_detail
