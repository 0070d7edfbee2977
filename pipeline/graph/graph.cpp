// The streaming graph declared in one place (build(): its nodes, a row of the node table each, then
// the edges of the wiring table) and the public face. The state it builds on is in
// graph_impl.hpp, the node bodies in graph_nodes.cpp, the edges in graph_wiring.*, the reads its
// async nodes submit in graph_io.cpp.
#include "pipeline/graph/graph.hpp"

#include <fmt/format.h>
#include <tbb/flow_graph.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "io/error.hpp"
#include "io/packed_trunk.hpp"
#include "pipeline/graph/graph_impl.hpp"
#include "stages/attnres.hpp"
#include "stages/head.hpp"
#include "stages/layer.hpp"
#include "stages/moe.hpp"
#include "stages/scratch.hpp"

namespace k3::pipeline {

Strategy parse_strategy(std::string_view name) {
  if (name == "serial") return Strategy::serial;
  if (name == "trunk") return Strategy::trunk;
  if (name == "overlap") return Strategy::overlap;
  if (name == "lookahead") return Strategy::lookahead;
  if (name == "auto") return Strategy::automatic;
  throw io::usage_error(fmt::format(
      "--strategy: unknown strategy '{}' (known: serial, trunk, overlap, lookahead, auto)", name));
}

const char* strategy_name(Strategy s) {
  switch (s) {
    case Strategy::serial:
      return "serial";
    case Strategy::trunk:
      return "trunk";
    case Strategy::overlap:
      return "overlap";
    case Strategy::lookahead:
      return "lookahead";
    case Strategy::automatic:
      return "auto";
  }
  return "?";
}

namespace {

template <class T>
inline constexpr bool is_tuple = false;
template <class... T>
inline constexpr bool is_tuple<std::tuple<T...>> = true;
template <class T>
inline constexpr bool is_sequencer = false;
template <class T>
inline constexpr bool is_sequencer<flow::sequencer_node<T>> = true;

}  // namespace

// Makes one row's node, with its body (NodeRow, graph_nodes.hpp) bound to this Impl, and registers
// it with the DOT description (or its own statistics) and its trace row; a node the run's graph
// does not have gets statistics only.
template <class Row>
void StreamingModel::Impl::add(const Row& row) {
  constexpr Node N = Row::id;
  using Type = typename Row::type;
  using Body = typename Row::body_type;
  const NodeInfo& info = row.info;
  if (!(info.graphs & trunk_graph)) {  // e.g. the raw graph is as it was, without the decode stage
    accounting.stats[N] = &accounting.own_stats[N];
    return;
  }
  accounting.tracks[N] = std::make_unique<TraceTrack>(fmt::format("node: {}", info.name),
                                                      info.concurrency == 0 ? std::min(2 * threads, 64) : 1);
  accounting.stats[N] =
      dot ? &dot->add_node(info.name, info.kind, info.concurrency, info.cluster) : &accounting.own_stats[N];
  auto bound = [this](auto f) {
    return [this, f](auto&&... a) -> decltype(auto) { return f(*this, std::forward<decltype(a)>(a)...); };
  };
  auto& made = std::get<N>(nodes);
  if constexpr (std::is_same_v<Body, NoBody>) {
    made = std::make_unique<Type>(flow_graph);
  } else if constexpr (is_tuple<Body>) {  // a key_matching join: a key function per input port
    made =
        std::apply([&](auto... key) { return std::make_unique<Type>(flow_graph, bound(key)...); }, row.body);
  } else if constexpr (is_sequencer<Type>) {
    made = std::make_unique<Type>(flow_graph, bound(row.body));
  } else {
    const size_t concurrency = info.concurrency == 0 ? size_t(flow::unlimited) : size_t(flow::serial);
    made = std::make_unique<Type>(flow_graph, concurrency, bound(row.body));
  }
}

// The graph, declared in one place: its nodes, a row of kNodeTable (graph_nodes.hpp) each, in the
// order of the diagram in graph.hpp, each running its body (graph_nodes.cpp), then the edges of the
// wiring table (graph_wiring.hpp), which the DOT description draws too.
void StreamingModel::Impl::build() {
  std::apply([this](const auto&... row) { (add(row), ...); }, kNodeTable);

  make_edges();
  if (!dot) return;
  dot->add_pool("trunk ring", "trunk io", uint64_t(trunk.ring_slots()), trunk.slot_read_bytes());
  if (trunk.compressed())
    dot->add_pool("decode slots", "trunk io", uint64_t(trunk.decode_slots()), trunk.decode_slot_bytes());
  dot->add_pool("pinned trunk", "trunk io", plan.pinned.size(),
                plan.pinned.empty() ? 0 : trunk.pinned_bytes() / plan.pinned.size());
  if (cache) dot->add_pool("expert slots", "moe", cache->slot_count(), cache->slot_bytes());
  if (exchange)
    dot->add_pool("exchange buffers", "moe", 2, exchange_buffer_bytes(cfg, plan.context, plan.max_seqs));
  describe_edges();
}

void StreamingModel::Impl::prepare_call(std::span<const stages::Segment> segs, size_t T,
                                        std::span<float> logits, bool head_all) {
  StepState& S = step_state;
  size_t cap = 0;
  for (const stages::Segment& s : segs) cap = std::max(cap, s.state->capacity());
  S.buf.prepare(cfg, T, cap, src.has_experts(), head_all ? T : segs.size());
  S.head_all = head_all;
  S.segs.assign(segs.begin(), segs.end());
  S.T = T;
  S.logits = logits;
}

// ------------------------------------------------------------------ the public face

StreamingModel::StreamingModel(const WeightSources& s, const MemoryPlan& p, Strategy st,
                               GraphDescription* dot, stages::ExpertExchange* exchange, ExpertPolicy policy,
                               int threads)
    : impl_(std::make_unique<Impl>(s, p, st, dot, exchange, policy, threads)) {}

StreamingModel::~StreamingModel() = default;

void StreamingModel::expect_calls(int n) {
  impl_->expected_calls = std::max(n, 1);
}

void StreamingModel::forward(stages::DecodeState& st, std::span<const int32_t> ids, std::span<float> logits,
                             stages::HeadAt head_at) {
  stages::check_forward_inputs(impl_->cfg, st, ids);
  const stages::Segment one{.state = &st, .first_row = 0, .rows = ids.size()};
  forward_batch(std::span(&one, 1), ids, logits, head_at);
}

void StreamingModel::forward_batch(std::span<const stages::Segment> segs, std::span<const int32_t> ids,
                                   std::span<float> logits, stages::HeadAt head_at) {
  Impl& m = *impl_;
  const io::ModelConfig& cfg = m.cfg;
  const size_t T = ids.size(), V = size_t(cfg.vocab);
  stages::check_segments(cfg, segs, ids);
  const bool head_all = head_at == stages::HeadAt::all;
  if (head_all && segs.size() != 1)
    throw io::runtime_error("forward: logits at every row need one segment (internal error)");
  if (m.plan.pass_rows && T > m.plan.pass_rows)
    throw io::runtime_error(fmt::format(
        "forward: {} rows in one pass, more than the plan's {} (internal error: the caller splits a "
        "longer feed into passes)",
        T, m.plan.pass_rows));
  if (m.failure.failed()) throw io::runtime_error(m.failure.message());
  if (m.calls_done.load() > 0 && m.step_delay_ms > 0)  // test hook: time to change files between tokens
    std::this_thread::sleep_for(std::chrono::milliseconds(m.step_delay_ms));

  // Reads for this call may have landed (and their bind nodes run) since the last call returned;
  // nothing but this call's nodes touches the activations prepared here.
  if (!m.call_gate.open(m.failure)) throw io::runtime_error(m.failure.message());
  m.accounting.activity.step_begin();
  m.prepare_call(segs, T, logits.first((head_all ? T : segs.size()) * V), head_all);
  const int k = m.calls_done.load();
  const Visit v0{uint64_t(k), 0};
  CallBuffers& buf = m.step(v0).buf;
  {
    m.accounting.activity.compute_begin();
    TraceSpan span(m.accounting.embed_track, "embed", "compute", m.args(-1));
    m.head->embed(cfg, ids, buf.P);
    m.step(v0).after_layer(stages::ForwardWatch::kEmbedding, buf.P, m.hidden);
    m.accounting.activity.compute_end();
  }
  auto job = [&](const TrunkJob& j) { m.node<kSchedule>().try_put(j); };
  auto claim = [&](const TrunkClaim& cl) { m.node<kTrunkRead>().try_put(cl); };
  auto ready = [&](const TrunkReady& r) {
    flow::input_port<size_t(LayerGateIn::ready)>(m.node<kLayerGate>()).try_put(r);
  };
  if (m.strategy == Strategy::serial) {
    m.request_layer(v0, job, claim, ready);
  } else {
    for (int l = 0; l < m.n_layers; ++l)
      if (m.trunk.pinned(l)) m.request_layer(Visit{v0.step, l}, job, claim, ready);
    if (m.ring_scheduled_through < k) m.schedule_ring(k);
    if (k + 1 < m.expected_calls && m.ring_scheduled_through < k + 1) m.schedule_ring(k + 1);
  }
  flow::input_port<size_t(LayerGateIn::go)>(m.node<kLayerGate>()).try_put(LayerGo{v0});
  m.call_gate.wait(m.arena);
  m.accounting.last_step = m.accounting.activity.step_end();
  if (m.tuner) {  // strategy auto: the next call prefetches or not, from what the steps cost
    m.tuner->after_call(m.accounting.last_step.wall_seconds, T);
    m.prefetch_on.store(m.tuner->prefetch(), std::memory_order_relaxed);
  }
  if (m.failure.failed()) {
    m.flow_graph.wait_for_all();  // every node has skipped its body or finished; reads have completed
    throw io::runtime_error(m.failure.message());
  }
  for (const stages::Segment& s : segs) s.state->cached += s.rows;
  if (m.routing) m.routing->end_call();
  m.replay_fed += T;
  ++m.calls_done;
}

void StreamingModel::record_routing(const std::string& path) {
  impl_->routing =
      std::make_unique<RoutingTraceWriter>(path, impl_->cfg.top_k, impl_->cfg.n_experts, impl_->n_layers);
}

void StreamingModel::replay_routing(RoutingTrace trace) {
  impl_->replay = std::make_unique<RoutingReplay>(std::move(trace), impl_->cfg.n_experts);
}

const StepStats& StreamingModel::last_step() const {
  return impl_->accounting.last_step;
}

StreamTotals StreamingModel::totals() const {
  Impl& m = *impl_;
  StreamTotals t;
  t.trunk_bytes_read = m.accounting.activity.trunk_bytes();
  t.expert_bytes_read = m.accounting.activity.expert_bytes();
  t.expert_requests = m.accounting.counts.requests.load();
  t.expert_hits = m.accounting.counts.hits.load();
  t.lookahead_predicted = m.accounting.counts.predicted.load();
  t.lookahead_used = m.accounting.counts.used.load();
  const io::ReaderCounters a = m.trunk_reader.counters(), b = m.expert_reader.counters();
  t.uring_bytes = a.uring_bytes + b.uring_bytes;
  t.pread_bytes = a.pread_bytes + b.pread_bytes;
  t.direct_bytes = a.direct_bytes + b.direct_bytes;
  if (m.trunk.compressed()) {
    t.codec = io::codec::codec_name(m.src.trunk()->codec());
    t.trunk_decoded_bytes = m.accounting.stats[kTrunkDecode]->bytes.load();
    t.decode_seconds = double(m.accounting.stats[kTrunkDecode]->busy_us.load()) * 1e-6;
  }
  t.io_busy_seconds = m.accounting.activity.io_busy_seconds();
  t.compute_busy_seconds = m.accounting.activity.compute_busy_seconds();
  t.uring = m.trunk_reader.backend() == io::UringReader::Backend::uring &&
            m.expert_reader.backend() == io::UringReader::Backend::uring;
  if (m.tuner)
    t.automatic = m.tuner->describe();
  else if (m.strategy == Strategy::automatic)
    t.automatic =
        "auto: no expert prefetch possible (the plan has no lookahead slots, or the model no routed "
        "experts): the overlap strategy";
  return t;
}

uint64_t StreamingModel::allocated_bytes() const {
  const Impl& m = *impl_;
  return m.head->bytes.size() + 4 * m.head->widen.size() + m.trunk.ring_bytes() + m.trunk.decode_bytes() +
         m.trunk.pinned_bytes() + (m.cache ? m.cache->arena_bytes() : 0);
}

}  // namespace k3::pipeline
