// The streaming graph's state, private to pipeline/graph/graph*.cpp: the per-step state (StepState)
// and StreamingModel::Impl -- what the run is, the pools sized once, the readers, the counters and
// the tbb::flow nodes (their types from kNodeTable, graph_nodes.hpp). graph.cpp declares the graph
// (build(): the nodes of kNodeTable, then the edges of graph_wiring.hpp) and the public face;
// graph_nodes.cpp holds the node bodies; graph_io.cpp puts reads on the two io_uring readers (trunk
// ring, expert slots), keeps each slot's read in flight, and emits the trace counters.
#pragma once
#include <fmt/format.h>
#include <tbb/flow_graph.h>
#include <tbb/info.h>
#include <tbb/task_arena.h>
#include <tbb/task_group.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include "io/codec/codec.hpp"
#include "io/env.hpp"
#include "io/layer_decode.hpp"
#include "io/uring_reader.hpp"
#include "pipeline/graph/call_buffers.hpp"
#include "pipeline/graph/expert_cache.hpp"
#include "pipeline/graph/graph.hpp"
#include "pipeline/graph/graph_messages.hpp"
#include "pipeline/graph/graph_nodes.hpp"
#include "pipeline/graph/moe_layer_run.hpp"
#include "pipeline/graph/prefetch_tuner.hpp"
#include "pipeline/graph/reader_options.hpp"
#include "pipeline/graph/routing_trace.hpp"
#include "pipeline/graph/slot_pool.hpp"
#include "pipeline/graph/trace.hpp"
#include "stages/moe.hpp"

namespace k3::pipeline {

using namespace graph_detail;  // this header is included only by graph*.cpp

// One decode step in flight: its inputs, activations, the layer being computed and its MoE run.
// A step carries one or more sequences (segments of its T rows, each with its own DecodeState);
// every row-wise node runs once over all T rows, the attention per segment, the head at each
// segment's last row. Today the driver runs one step at a time (StreamingModel::Impl::step() has
// one); several steps in flight would be a table of these keyed by step.
struct StepState {
  explicit StepState(MoeLayerRun::Waves w) : moe(w) {}
  std::vector<stages::Segment> segs;
  std::vector<stages::LayerSegment> layer_segs;  // the attention node's per-layer views of segs
  size_t T = 0;                                  // rows: every segment's together
  std::span<float> logits;                       // segs.size() x vocab (head_all: T x vocab)
  bool head_all = false;                         // the head at every row (one segment: a verify pass)
  // After layer `layer`'s output is in P: each segment's watch scans its own rows.
  void after_layer(int layer, std::span<const float> P, size_t hidden) {
    for (const stages::Segment& s : segs)
      s.state->watch.after_layer(layer, P.subspan(s.first_row * hidden, s.rows * hidden), hidden,
                                 s.state->cached);
  }
  CallBuffers buf;
  struct Current {  // the layer being computed (one at a time: each needs the previous one's output)
    int layer = -1;
    SlotRef slot;
    const stages::LayerWeights* w = nullptr;
  } cur;
  MoeLayerRun moe;  // the MoE layer being computed
};

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

  // ---- accounting ----
  Activity activity;
  StepStats last_step;  // the last forward call's
  ExpertCounters counts;
  std::atomic<uint64_t> read_ids{0};
  std::atomic<int> ring_in_use{0};
  // Compressed trunk: reads submitted (TrunkReady::seq), decoded slots in use, the decode stage's
  // output bytes and time, and which layers have been decoded once (their block checks verified).
  uint64_t read_seq = 0;
  std::atomic<int> decode_in_use{0};
  std::atomic<uint64_t> decoded_bytes{0}, decode_us{0};
  std::vector<char> decoded_once;
  // Fused decode (exp4 / exp3, streamed layers; docs/codec.md "Fused decode"): the layer's projections are
  // bound coded over its stored bytes, which stay in the ring slot until layer_done, and the matvecs
  // decode them tile by tile; the decode stage decodes only the rest. Per decoded slot: the parsed
  // stream its coded matrices decode from, and the first ring slot it holds (-1: none). Per layer:
  // the byte ranges bound coded (from the layout at construction; `fused_known` then set).
  const bool fused;
  std::vector<std::optional<io::codec::Stream>> dec_stream;
  std::vector<int> dec_ring;
  std::vector<io::ByteRanges> fused_ranges;
  std::unique_ptr<std::atomic<bool>[]> fused_known;
  // Pinned trunk bytes loaded so far of their total, for the first step's progress bar.
  std::atomic<uint64_t> pin_loaded_bytes{0};
  uint64_t pin_total_bytes = 0;
  std::unique_ptr<NodeStats[]> own_stats;
  NodeStats* stats[kNodeCount] = {};
  // Trace rows: one per node (lanes where its runs overlap), one per reader for its reads.
  std::unique_ptr<TraceTrack> tracks[kNodeCount];
  TraceTrack embed_track{"node: embed"}, trunk_track{"reader: trunk"}, expert_track{"reader: experts"};

  // ---- failure: the first message wins; nodes skip their bodies afterwards ----
  std::atomic<bool> failed{false};
  std::mutex fail_mu;
  std::string fail_msg;

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
  io::LayerDecodeScratch decode_scratch;                 // trunk_decode
  std::vector<io::ReadRequest> trunk_reqs, expert_reqs;  // trunk_read, expert_read
  ExpertRead expert_read;                                // expert_read: one expert's, reused
  std::vector<int> hit_groups, predicted_experts;        // expert_fetch, lookahead
  std::vector<ExpertGo> go_out;                          // expert_landed
  const int step_delay_ms = io::env::integer_or_zero(io::env::kTestStepDelayMs);
  const int read_delay_ms = io::env::integer_or_zero(io::env::kTestReadDelayMs);  // a slow disk, for tests

  // ---- the end of a forward call: the driver waits for call_group, which call_open holds until
  // the head has run (or the run failed). Not flow_graph.wait_for_all(): that also waits for reads
  // already in flight for the next call, and the next token's resident layers could be computing by
  // then.
  std::mutex call_mu;
  tbb::task_group call_group;
  tbb::task_handle call_open;

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
        fused(fused_codec(p.codec)),
        step_state(waves_of(st)),
        graph_owner(graph_in(arena)),
        flow_graph(*graph_owner),
        trunk_reader(trunk_reader_options()),
        expert_reader(expert_reader_options(s.expert_window_bytes())) {
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
      if (trunk.pinned(l)) pin_total_bytes += trunk.bytes(l, -1).size();
    // Nothing to choose when the plan has no lookahead slots (at the floor) or the model no routed
    // experts: auto is then overlap, and says so instead of timing two identical arms.
    if (strategy == Strategy::automatic && cache && plan.lookahead_slots > 0) {
      tuner.emplace();
      prefetch_on = tuner->prefetch();
    }
    build();
    for (int slot = 0; slot < trunk.ring_slots(); ++slot) node<kTrunkFree>().try_put(SlotRef{slot});
    decoded_once.assign(size_t(n_layers), 0);
    dec_stream.resize(size_t(trunk.decode_slots()));
    dec_ring.assign(size_t(trunk.decode_slots()), -1);
    fused_ranges.resize(size_t(n_layers));
    fused_known = std::make_unique<std::atomic<bool>[]>(size_t(n_layers));
    for (int l = 0; l < n_layers && fused; ++l) {  // the coded ranges, from the layout (nothing read)
      fused_ranges[size_t(l)] = stages::coded_ranges(cfg, l, src.layer(l).layout, src.layer(l).bind_offset);
      fused_known[size_t(l)].store(true);
    }
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

  void fail(const std::string& msg) {
    {
      std::lock_guard lk(fail_mu);
      if (!failed.load()) {
        fail_msg = msg;
        failed.store(true);
      }
    }
    end_call();  // the call in progress cannot finish: let the driver see the failure
  }

  // Opens a forward call (false: the run has already failed); end_call() closes it, from the head
  // node or from fail(); wait_call() returns when it is closed.
  bool open_call() {
    std::lock_guard lk(call_mu);
    if (failed.load()) return false;
    call_open = call_group.defer([] {});
    return true;
  }
  void end_call() {
    std::lock_guard lk(call_mu);
    call_open = tbb::task_handle{};  // dropping the handle releases call_group's wait
  }
  void wait_call() {
    arena.execute([&] { call_group.wait(); });
  }

  // Runs a node body: skipped after a failure; an exception becomes the run's failure; its wall
  // time goes to the node's statistics, the trace, and compute-busy when it computes.
  template <class F>
  void run_node(Node id, bool compute, const TraceArgs& args, F&& body) {
    if (failed.load(std::memory_order_relaxed)) return;
    const auto t0 = std::chrono::steady_clock::now();
    if (compute) activity.compute_begin();
    {
      TraceSpan span(*tracks[id], node_name(id),
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
    if (compute) activity.compute_end();
    const auto us =
        std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - t0);
    stats[id]->items.fetch_add(1, std::memory_order_relaxed);
    stats[id]->busy_us.fetch_add(uint64_t(us.count()), std::memory_order_relaxed);
  }

  TraceArgs args(int layer, int64_t expert = -1, int64_t slot = -1) const {
    TraceArgs a;
    a.layer = layer;
    a.expert = expert;
    a.slot = slot;
    a.token = calls_done.load(std::memory_order_relaxed);
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
