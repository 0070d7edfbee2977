// The streaming graph's state, private to pipeline/graph/graph*.cpp: StreamingModel::Impl -- what
// the run is, the pools sized once, the readers and the tbb::flow nodes (their types from
// kNodeTable, graph_nodes.hpp). Its parts have headers of their own: the per-step state
// (step_state.hpp), the decode stage's (trunk_decode_stage.hpp), what the run counts and traces
// (run_accounting.hpp), the failure latch (failure_latch.hpp) and the forward call's end
// (call_gate.hpp). graph.cpp declares the graph (build(): the nodes of kNodeTable, then the edges of
// graph_wiring.hpp) and the public face; graph_nodes.cpp holds the node bodies; graph_io.cpp puts
// reads on the two io_uring readers (trunk ring, expert slots), keeps each slot's read in flight,
// and emits the trace counters.
#pragma once
#include <fmt/format.h>
#include <tbb/flow_graph.h>
#include <tbb/info.h>
#include <tbb/task_arena.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include "io/env.hpp"
#include "io/uring_reader.hpp"
#include "pipeline/graph/call_gate.hpp"
#include "pipeline/graph/expert_cache.hpp"
#include "pipeline/graph/failure_latch.hpp"
#include "pipeline/graph/graph.hpp"
#include "pipeline/graph/graph_messages.hpp"
#include "pipeline/graph/graph_nodes.hpp"
#include "pipeline/graph/moe_layer_run.hpp"
#include "pipeline/graph/prefetch_tuner.hpp"
#include "pipeline/graph/reader_options.hpp"
#include "pipeline/graph/routing_trace.hpp"
#include "pipeline/graph/run_accounting.hpp"
#include "pipeline/graph/slot_pool.hpp"
#include "pipeline/graph/step_state.hpp"
#include "pipeline/graph/trace.hpp"
#include "pipeline/graph/trunk_decode_stage.hpp"
#include "stages/moe.hpp"

namespace k3::pipeline {

using namespace graph_detail;  // this header is included only by graph*.cpp

struct StreamingModel::Impl {
  // ---- where the graph's tasks run: an arena of its own, so the driver thread can wait for one
  // call inside it (and execute the graph's tasks while it waits, as it must with one thread), of
  // `threads` threads (the command's --threads, passed down) ----
  const int threads;
  tbb::task_arena arena;

  // ---- what the run is ----
  const WeightSources& src;
  const io::ModelConfig& cfg;
  const MemoryPlan plan;
  const Strategy strategy;
  const int n_layers;          // bound layers
  const size_t hidden, top_k;  // cfg.hidden (a row's width), cfg.top_k (routed experts per row)
  GraphDescription* dot;
  // One rank of several (expert parallel, docs/distributed.md §6): it reads and computes only the
  // routed experts it owns, and expert_exchange hands every rank the others' rows. Null alone.
  stages::ExpertExchange* const exchange;
  // Which graph this is, one bit of kGraphs (graph_messages.hpp): raw or compressed trunk (the
  // decode stage), one process or ranks (expert_exchange).
  const unsigned trunk_graph;

  // ---- memory, sized once ----
  std::unique_ptr<WeightSources::Head> head;
  TrunkSlots trunk;
  std::unique_ptr<ExpertCache> cache;
  std::unique_ptr<RoutingTraceWriter> routing;  // --routing-trace: the router's choices, per call
  std::unique_ptr<RoutingReplay> replay;        // bench --routing-replay: the trace's choices instead
  uint64_t replay_fed = 0;                      // positions fed by earlier calls
  struct SlotRead {                             // the read in flight into an expert slot
    const stages::Layout* layout = nullptr;
    uint64_t bind_offset = 0, bytes = 0, trace_id = 0;
    const char* trace_name = "expert read";
    Visit visit;
    int layer = -1, expert = -1;
    std::atomic<int> pending{0};
    std::atomic<bool> failed{false};
  };
  std::unique_ptr<SlotRead[]> slot_reads;

  // ---- the compressed trunk's decode stage (its slots, streams and scratch) ----
  TrunkDecodeStage decode;

  // ---- what the run counts and traces ----
  RunAccounting accounting;

  // ---- failure: the first message wins; nodes skip their bodies afterwards ----
  FailureLatch failure;

  // ---- the decode step in progress (one at a time; see StepState) ----
  StepState step_state;
  StepState& step(Visit) { return step_state; }
  std::atomic<int> calls_done{0};
  int expected_calls = 1;
  // Strategy auto: the tuner (driver thread only, between calls) and its choice, read by the
  // lookahead node; every other strategy leaves prefetch on (it matters only to lookahead).
  std::optional<PrefetchTuner> tuner;
  std::atomic<bool> prefetch_on{true};
  int64_t ring_scheduled_through = -1;  // ring jobs are queued for every call <= this

  // ---- node-local scratch, reused (each of these nodes is serial) ----
  std::vector<SlotRef> span_held;                        // trunk_read
  std::vector<io::ReadRequest> trunk_reqs, expert_reqs;  // trunk_read, expert_read
  ExpertRead expert_read;                                // expert_read: one expert's, reused
  std::vector<int> hit_groups, predicted_experts;        // expert_fetch, lookahead
  std::vector<ExpertGo> go_out;                          // expert_landed
  const int step_delay_ms = io::env::integer_or_zero(io::env::kTestStepDelayMs);
  const int read_delay_ms = io::env::integer_or_zero(io::env::kTestReadDelayMs);  // a slow disk, for tests

  // ---- the end of a forward call: the driver waits until the head has run (or the run failed) ----
  CallGate call_gate;

  // ---- the graph (made inside `arena`, so its tasks run there); nodes indexed by Node ----
  std::unique_ptr<flow::graph> graph_owner;
  flow::graph& flow_graph;
  Owned<NodeTable>::type nodes;
  template <Node N>
  NodeType<N>& node() {
    return *std::get<N>(nodes);
  }

  // ---- readers: declared last, so destroyed first (they write into the slots above) ----
  io::UringReader trunk_reader, expert_reader;

  static std::unique_ptr<flow::graph> graph_in(tbb::task_arena& a) {
    std::unique_ptr<flow::graph> made;
    a.execute([&] { made = std::make_unique<flow::graph>(); });  // the graph attaches to `a`
    return made;
  }

  static MoeLayerRun::Waves waves_of(Strategy s) {
    if (s == Strategy::serial) return MoeLayerRun::Waves::serial;
    if (s == Strategy::trunk) return MoeLayerRun::Waves::trunk;
    return MoeLayerRun::Waves::none;
  }

  Impl(const WeightSources& s, const MemoryPlan& p, Strategy st, GraphDescription* d,
       stages::ExpertExchange* x, ExpertPolicy policy, int n_threads)
      : threads(n_threads > 0 ? n_threads : tbb::info::default_concurrency()),
        arena(threads),
        src(s),
        cfg(s.config()),
        plan(p),
        strategy(st),
        n_layers(s.n_layers()),
        hidden(size_t(cfg.hidden)),
        top_k(size_t(cfg.top_k)),
        dot(d),
        exchange(s.has_experts() ? x : nullptr),
        trunk_graph(p.codec.empty() ? (exchange ? kRawRanks : kRawOne)
                                    : (exchange ? kCompressedRanks : kCompressedOne)),
        trunk(p, s),
        decode(p, s, trunk.decode_slots()),
        step_state(waves_of(st)),
        graph_owner(graph_in(arena)),
        flow_graph(*graph_owner),
        trunk_reader(trunk_reader_options()),
        expert_reader(expert_reader_options(s.expert_window_bytes(), p.max_seqs)) {
    head = src.load_head();
    if (src.has_experts()) {
      const uint64_t slots = p.inflight_slots + p.lookahead_slots + p.cache_slots;
      const uint64_t widen = src.expert_widen_floats();
      cache = std::make_unique<ExpertCache>(slots,
                                            p.expert_slot_bytes - io::align_up(4 * widen, io::kDirectAlign),
                                            widen, n_layers, cfg.n_experts, policy);
      slot_reads = std::make_unique<SlotRead[]>(slots);
    }
    for (int l = 0; l < n_layers; ++l)
      if (trunk.pinned(l)) accounting.pin_total_bytes += trunk.bytes(l, -1).size();
    // Nothing to choose when the plan has no lookahead slots (at the floor) or the model no routed
    // experts: auto is then overlap, and says so instead of timing two identical arms.
    if (strategy == Strategy::automatic && cache && plan.lookahead_slots > 0) {
      tuner.emplace();
      prefetch_on = tuner->prefetch();
    }
    build();
    for (int slot = 0; slot < trunk.ring_slots(); ++slot) node<kTrunkFree>().try_put(SlotRef{slot});
    for (int slot = 0; slot < trunk.decode_slots(); ++slot) node<kDecodeFree>().try_put(DecodeSlot{slot});
    // every layer pinned: no decoded slots, but the pins' first reads still pass the decode join
    if (trunk.compressed() && trunk.decode_slots() == 0) node<kDecodeFree>().try_put(DecodeSlot{-1});
    flow_graph.wait_for_all();
  }

  ~Impl() {
    trunk_reader.wait_idle();
    expert_reader.wait_idle();
    flow_graph.wait_for_all();
  }

  // ------------------------------------------------------------------ helpers

  // Latches the run's failure (the first message wins) and closes the call in progress, which
  // cannot finish: the driver sees the failure.
  void fail(const std::string& msg) {
    failure.set(msg);
    call_gate.end();
  }

  // Runs a node body: skipped after a failure; an exception becomes the run's failure; its wall
  // time goes to the node's statistics, the trace, and compute-busy when it computes.
  template <class F>
  void run_node(Node id, bool compute, const TraceArgs& args, F&& body) {
    if (failure.failed(std::memory_order_relaxed)) return;
    const auto t0 = std::chrono::steady_clock::now();
    if (compute) accounting.activity.compute_begin();
    {
      TraceSpan span(*accounting.tracks[id], node_name(id),
                     compute           ? "compute"
                     : id == kExchange ? "comm"
                                       : "graph",
                     args);
      try {
        body();
      } catch (const std::exception& e) {
        fail(e.what());
      }
    }
    if (compute) accounting.activity.compute_end();
    const auto us =
        std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - t0);
    accounting.stats[id]->items.fetch_add(1, std::memory_order_relaxed);
    accounting.stats[id]->busy_us.fetch_add(uint64_t(us.count()), std::memory_order_relaxed);
  }

  TraceArgs args(int layer, int64_t expert = -1, int64_t slot = -1) const {
    TraceArgs a;
    a.layer = layer;
    a.expert = expert;
    a.slot = slot;
    a.token = calls_done.load(std::memory_order_relaxed);
    return a;
  }
  // A compute span's arguments with the rows it computed (a batched step: one per sequence fed).
  TraceArgs args_rows(size_t rows, int layer, int64_t expert = -1, int64_t slot = -1) const {
    TraceArgs a = args(layer, expert, slot);
    a.rows = int64_t(rows);
    return a;
  }

  uint64_t key(Visit v) const { return visit_key(v, n_layers); }
  // lookahead and auto run the lookahead graph (auto switches its prefetch per step).
  bool lookahead_graph() const { return strategy == Strategy::lookahead || strategy == Strategy::automatic; }

  void counters();  // the trace's slot and resident-bytes counters (nothing when tracing is off)

  // ------------------------------------------------------------------ trunk reads (graph_io.cpp)

  // Reads visit `visit`'s layer into its ring slot (or pin region); the gateway gets TrunkReady
  // when the last extent lands.
  void submit_trunk(Visit visit, SlotRef slot, TrunkReadNode::gateway_type& gw);

  // Puts visit v's trunk on its way: a loaded pin is ready now, an unloaded one is read into its
  // region, a ring layer is scheduled (one part per slot it takes).
  template <class Job, class Claim, class Ready>
  void request_layer(Visit v, Job&& job, Claim&& claim, Ready&& ready) {
    const int l = v.layer;
    if (trunk.pinned(l)) {
      if (trunk.pin_loaded(l))
        ready(TrunkReady{v, SlotRef::pin()});
      else if (!trunk.compressed())
        claim(TrunkClaim{TrunkJob{v, 0}, SlotRef::pin()});
      else  // compressed: the first read is staged through the ring, then decoded into the pin region
        for (int p = 0; p < trunk.parts(l); ++p) job(TrunkJob{v, p});
      return;
    }
    const int parts = trunk.parts(l);
    for (int p = 0; p < parts; ++p) job(TrunkJob{v, p});
  }

  void schedule_ring(int call_index);  // queues every ring layer's read jobs for that forward call

  // ------------------------------------------------------------------ experts (graph_io.cpp)

  // Reads a batch of claimed expert slots, sorted by file offset; the gateway gets ExpertLanded per
  // slot when its last chunk lands.
  void submit_experts(const ReadBatch& b, ExpertReadNode::gateway_type& gw);

  // Binds a landed read's expert weights; returns its group (< 0: a prefetch).
  int bind_landed(int slot);

  // ------------------------------------------------------------------ the graph

  void build();  // graph.cpp: the nodes of kNodeTable, then the edges of the wiring table
  template <class Row>
  void add(const Row& row);  // graph.cpp: makes one row's node (build() calls it per row)
  void make_edges();         // graph_wiring.cpp
  void describe_edges();     // graph_wiring.cpp: the same table, to the DOT description
  void prepare_call(std::span<const stages::Segment> segs, size_t T, std::span<float> logits, bool head_all);

  // The node bodies (graph_nodes.cpp), one per node that runs code, in the diagram's order; each
  // row of kNodeTable (graph_nodes.hpp) names its node's.
  void trunk_read_body(const TrunkClaim&, TrunkReadNode::gateway_type&);
  void trunk_decode_body(const DecodeClaim&, Outputs<kTrunkDecode>&);
  void trunk_bind_body(const TrunkReady&, Outputs<kTrunkBind>&);
  void attention_body(const GatedLayer&, Outputs<kAttention>&);
  void dense_ffn_body(const DenseGo&, Outputs<kDenseFfn>&);
  void router_body(const RouteGo&, Outputs<kRouter>&);
  void expert_fetch_body(const FetchGo&, Outputs<kExpertFetch>&);
  void expert_read_body(const ReadBatch&, ExpertReadNode::gateway_type&);
  void expert_landed_body(const ExpertLanded&, Outputs<kExpertLanded>&);
  void shared_body(const SharedGo&, Outputs<kShared>&);
  void expert_compute_body(const GatedExpert&, Outputs<kExpertCompute>&);
  void lookahead_body(const LookaheadGo&, Outputs<kLookahead>&);
  void exchange_body(const PieceDone&, Outputs<kExchange>&);
  void combine_body(const PieceDone&, Outputs<kCombine>&);
  void layer_done_body(const LayerDone&, Outputs<kLayerDone>&);
  void head_body(const HeadGo&);
};

}  // namespace k3::pipeline
