// The wiring table (graph_wiring.hpp) applied: tbb::flow edges, and the same edges drawn.
#include "pipeline/graph/graph_wiring.hpp"

#include <type_traits>
#include <utility>

#include "pipeline/graph/graph_impl.hpp"

namespace k3::pipeline {

namespace {

template <auto P, class N>
auto& sender(N& node) {
  if constexpr (std::is_same_v<decltype(P), Whole>)
    return node;
  else
    return flow::output_port<size_t(P)>(node);
}

template <auto P, class N>
auto& receiver(N& node) {
  if constexpr (std::is_same_v<decltype(P), Whole>)
    return node;
  else
    return flow::input_port<size_t(P)>(node);
}

// Every output of every node is wired exactly once in the graph that sends on it (the head's logits
// leave through the driver): no message is sent where nothing listens, and no port has two
// listeners. A port may be unwired in one graph (kGraphs: raw or compressed trunk, one process or
// ranks) when that graph never sends on it: layer_done's decoded slots, the raw trunk_read ->
// trunk_bind edge, expert_exchange's output in one process.
constexpr bool once(Node n, int out) {
  int any = 0;
  for (unsigned g : kGraphs) {
    const int k = wires_from(n, out, g);
    if (k > 1) return false;
    any += k;
  }
  return any >= 1;
}
template <Node N>
constexpr bool outputs_wired_once() {
  if constexpr (N == kHead) {
    return wires_from(N, -1) == 0;
  } else if constexpr (requires { typename NodeType<N>::output_ports_type; }) {
    constexpr int ports = int(std::tuple_size_v<typename NodeType<N>::output_ports_type>);
    if (ports == 1) {  // e.g. an async_node
      for (unsigned g : kGraphs)
        if (wires_from(N, -1, g) + wires_from(N, 0, g) > 1) return false;
      return wires_from(N, -1) + wires_from(N, 0) >= 1;
    }
    for (int p = 0; p < ports; ++p)
      if (!once(N, p)) return false;
    return wires_from(N, -1) == 0;
  } else {
    return once(N, -1);
  }
}
template <int... N>
constexpr bool all_outputs_wired_once(std::integer_sequence<int, N...>) {
  return (outputs_wired_once<Node(N)>() && ...);
}
static_assert(all_outputs_wired_once(std::make_integer_sequence<int, kNodeCount>{}),
              "kWiring: a node's output port is unwired or wired twice");

}  // namespace

void StreamingModel::Impl::make_edges() {
  auto connect = [this]<Node From, auto Out, Node To, auto In>(const Wire<From, Out, To, In>& w) {
    if (w.trunks & trunk_graph) flow::make_edge(sender<Out>(node<From>()), receiver<In>(node<To>()));
  };
  std::apply(
      [&](const auto&... w) {
        (
            [&](const auto& x) {
              if constexpr (!std::is_same_v<std::decay_t<decltype(x)>, PoolWire>) connect(x);
            }(w),
            ...);
      },
      kWiring);
}

void StreamingModel::Impl::describe_edges() {
  const bool waves = strategy == Strategy::serial || strategy == Strategy::trunk;
  auto draw = [&]<Node From, auto Out, Node To, auto In>(const Wire<From, Out, To, In>& w) {
    if (!(w.drawn & in(strategy)) || !(w.trunks & trunk_graph)) return;
    dot->add_edge(node_name(From), node_name(To), waves && w.wave_label ? w.wave_label : w.label);
  };
  std::apply(
      [&](const auto&... w) {
        (
            [&](const auto& x) {
              if constexpr (std::is_same_v<std::decay_t<decltype(x)>, PoolWire>) {
                if ((!x.experts_only || cache) && (x.trunks & trunk_graph))
                  dot->add_edge(x.pool, node_name(x.to), x.label);
              } else {
                draw(x);
              }
            }(w),
            ...);
      },
      kWiring);
}

}  // namespace k3::pipeline
