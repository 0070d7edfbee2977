// The streaming graph's state, private to pipeline/graph*.cpp: the messages (handles, never
// weights), the node ids, and StreamingModel::Impl -- what the run is, the pools sized once, the
// forward call in progress and the tbb::flow nodes. graph.cpp declares the graph (build(): nodes and
// edges in one place) and the public face; graph_io.cpp puts reads on the two io_uring readers
// (trunk ring, expert slots), keeps each slot's read in flight, and emits the trace counters.
#pragma once
#include <fmt/format.h>
#include <tbb/flow_graph.h>
#include <tbb/global_control.h>
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

#include "io/uring_reader.hpp"
#include "pipeline/expert_cache.hpp"
#include "pipeline/graph.hpp"
#include "pipeline/prefetch_tuner.hpp"
#include "pipeline/reader_options.hpp"
#include "pipeline/slot_pool.hpp"
#include "pipeline/trace.hpp"
#include "stages/moe.hpp"

namespace k3::pipeline {

namespace graph_detail {

namespace flow = tbb::flow;

// ---- messages: handles only ----
struct TrunkJob {
  uint64_t visit;  // call * n_layers + layer
  int layer;
  int part;  // the spanning layer is scheduled as ring_slots parts, one slot each
};
using TrunkClaim = std::tuple<TrunkJob, int>;  // slot < 0: the layer's pin region
struct TrunkReady {
  uint64_t visit;
  int layer;
  int slot;
};
struct LayerGo {
  uint64_t visit;  // the hidden state is ready for this visit
};
struct LayerMsg {
  uint64_t visit;
};
struct LayerDone {
  uint64_t visit;
};
struct FetchMsg {
  uint64_t visit;
};
struct ReadItem {
  int slot, layer, expert;
  bool prefetch;
};
struct ReadBatch {
  std::vector<ReadItem> items;
};
struct ExpertLanded {
  int slot;
  int group;  // for a hit; a read's group comes back from the cache
  bool read, ok;
};
struct ExpertGo {
  uint64_t key;
  int group, slot;
};
struct LatentGo {
  uint64_t key;
};
struct HeadMsg {
  uint64_t visit;
};

inline uint64_t group_key(uint64_t visit, int group) {
  return (visit << 16) | uint64_t(group);  // groups < 65536: n_experts is capped there
}

enum Node : int {
  kSchedule,
  kTrunkFree,
  kTrunkClaim,
  kTrunkRead,
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
  kCombine,
  kLayerDone,
  kHead,
  kNodeCount
};

inline constexpr const char* kNodeNames[kNodeCount] = {
    "trunk_schedule", "trunk_free",    "trunk_claim", "trunk_read",  "trunk_bind",
    "layer_gate",     "attention",     "dense_ffn",   "router",      "expert_fetch",
    "expert_read",    "expert_landed", "shared",      "expert_join", "expert_compute",
    "lookahead",      "combine",       "layer_done",  "head"};

}  // namespace graph_detail

using namespace graph_detail;  // this header is included only by graph*.cpp

struct StreamingModel::Impl {
  using TrunkReadNode = flow::async_node<TrunkClaim, TrunkReady>;
  using ExpertReadNode = flow::async_node<ReadBatch, ExpertLanded>;

  // ---- where the graph's tasks run: an arena of its own, so the driver thread can wait for one
  // call inside it (and execute the graph's tasks while it waits, as it must with one thread) ----
  tbb::task_arena arena;

  // ---- what the run is ----
  const WeightSources& src;
  const io::ModelConfig& c;
  const Plan plan;
  const Strategy strategy;
  const int n;  // bound layers
  const size_t E, L, K;
  GraphDescription* dot;

  // ---- memory, sized once ----
  std::unique_ptr<WeightSources::Head> head;
  TrunkSlots trunk;
  std::unique_ptr<ExpertCache> cache;
  struct SlotRead {  // the read in flight into an expert slot
    const stages::Layout* layout = nullptr;
    uint64_t bind_offset = 0, bytes = 0, trace_id = 0;
    const char* trace_name = "expert read";
    int layer = -1, expert = -1;
    std::atomic<int> pending{0};
    std::atomic<bool> failed{false};
  };
  std::unique_ptr<SlotRead[]> slot_reads;

  // ---- accounting ----
  Activity act;
  StepStats last;
  std::atomic<uint64_t> requests{0}, hits{0}, predicted{0}, used{0}, read_ids{0};
  std::atomic<int> ring_in_use{0};
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

  // ---- the forward call in progress ----
  struct Call {
    stages::DecodeState* st = nullptr;
    size_t T = 0;
    std::span<float> logits;
    std::vector<float> mem;  // grows only
    std::span<float> P, blocks, x, a, attn_sc, dense_sc, h, head_sc, agg_sc;
    std::span<float> route_sc, weight, z, eout, shared, shared_sc, apply_sc, combine_sc, la_route_sc,
        la_weight;
    std::vector<int32_t> idx, la_idx;
    std::optional<stages::BlockStack> B;
  } call;
  struct Current {  // the layer being computed (one at a time: each needs the previous one's output)
    uint64_t visit = kNoVisit;
    int layer = -1, slot = -1;
    const stages::LayerWeights* w = nullptr;
  } cur;
  struct Moe {  // the MoE layer being computed
    std::mutex mu;
    uint64_t visit = kNoVisit;
    int layer = -1;
    stages::ExpertGroups groups;
    std::vector<int> slot;
    std::vector<size_t> apply_off;
    size_t next_pending = 0;   // groups [next_pending, U) wait for a free slot
    size_t wave_pending = 0;   // trunk / serial: claimed groups whose bytes have not landed
    std::vector<int> held;     // trunk / serial: landed groups held until their wave is complete
    std::vector<int> unbound;  // serial: landed reads' slots, bound when their wave is complete
    size_t computing = 0;      // groups sent to expert_compute and not yet computed
    bool shared_started = false, fetched = false;
    std::atomic<int> remaining{0};  // pieces left: groups + shared (+ lookahead)
    size_t unique() const { return groups.experts.size(); }
  } moe;
  std::atomic<int> calls_done{0};
  int expected_calls = 1;
  // Strategy auto: the tuner (driver thread only, between calls) and its choice, read by the
  // lookahead node; every other strategy leaves prefetch on (it matters only to lookahead).
  std::optional<PrefetchTuner> tuner;
  std::atomic<bool> prefetch_on{true};
  int64_t ring_scheduled_through = -1;  // ring jobs are queued for every call <= this
  std::vector<int> span_held;
  std::vector<io::ReadRequest> trunk_reqs, expert_reqs;  // reused by the serial read nodes
  std::vector<ExpertRead> expert_reads;
  std::vector<size_t> order;
  std::vector<int> hit_groups, predicted_experts;
  std::vector<ExpertGo> go_out;
  const int step_delay_ms = env_int("K3FLOW_TEST_STEP_DELAY_MS");
  const int read_delay_ms = env_int("K3FLOW_TEST_READ_DELAY_MS");  // a slow disk, for tests

  // ---- the end of a forward call: the driver waits for call_group, which call_open holds until
  // the head has run (or the run failed). Not g.wait_for_all(): that also waits for reads already
  // in flight for the next call, and the next token's resident layers could be computing by then.
  std::mutex call_mu;
  tbb::task_group call_group;
  tbb::task_handle call_open;

  // ---- the graph (made inside `arena`, so its tasks run there) ----
  std::unique_ptr<flow::graph> graph_owner;
  flow::graph& g;
  std::unique_ptr<flow::queue_node<TrunkJob>> schedule;
  std::unique_ptr<flow::queue_node<int>> trunk_free;
  std::unique_ptr<flow::join_node<TrunkClaim, flow::queueing>> trunk_claim;
  std::unique_ptr<TrunkReadNode> trunk_read;
  std::unique_ptr<flow::multifunction_node<TrunkReady, std::tuple<TrunkReady>>> trunk_bind;
  std::unique_ptr<flow::join_node<std::tuple<LayerGo, TrunkReady>, flow::key_matching<uint64_t>>> layer_gate;
  std::unique_ptr<flow::multifunction_node<std::tuple<LayerGo, TrunkReady>, std::tuple<LayerMsg, LayerMsg>>>
      attention;
  std::unique_ptr<flow::multifunction_node<LayerMsg, std::tuple<LayerDone>>> dense_ffn;
  std::unique_ptr<flow::multifunction_node<LayerMsg, std::tuple<FetchMsg, LayerMsg>>> router;
  std::unique_ptr<flow::multifunction_node<FetchMsg, std::tuple<ReadBatch, ExpertLanded, LayerMsg>>>
      expert_fetch;
  std::unique_ptr<ExpertReadNode> expert_read;
  std::unique_ptr<flow::multifunction_node<ExpertLanded, std::tuple<ExpertGo, LayerMsg, FetchMsg>>>
      expert_landed;
  std::unique_ptr<flow::multifunction_node<LayerMsg, std::tuple<LatentGo, FetchMsg, LayerMsg>>> shared;
  std::unique_ptr<flow::join_node<std::tuple<ExpertGo, LatentGo>, flow::key_matching<uint64_t>>> expert_join;
  std::unique_ptr<flow::multifunction_node<std::tuple<ExpertGo, LatentGo>, std::tuple<FetchMsg, LayerMsg>>>
      expert_compute;
  std::unique_ptr<flow::multifunction_node<LayerMsg, std::tuple<ReadBatch, LayerMsg>>> lookahead;
  std::unique_ptr<flow::multifunction_node<LayerMsg, std::tuple<LayerDone>>> combine;
  std::unique_ptr<flow::multifunction_node<
      LayerDone, std::tuple<int, LayerGo, HeadMsg, TrunkJob, TrunkClaim, TrunkReady>>>
      layer_done;
  std::unique_ptr<flow::function_node<HeadMsg>> head_node;

  // ---- readers: declared last, so destroyed first (they write into the slots above) ----
  io::UringReader trunk_reader, expert_reader;

  static std::unique_ptr<flow::graph> graph_in(tbb::task_arena& a) {
    std::unique_ptr<flow::graph> made;
    a.execute([&] { made = std::make_unique<flow::graph>(); });  // the graph attaches to `a`
    return made;
  }

  Impl(const WeightSources& s, const Plan& p, Strategy st, GraphDescription* d)
      : arena(int(tbb::global_control::active_value(tbb::global_control::max_allowed_parallelism))),
        src(s),
        c(s.config()),
        plan(p),
        strategy(st),
        n(s.n_layers()),
        E(size_t(c.hidden)),
        L(size_t(c.latent)),
        K(size_t(c.top_k)),
        dot(d),
        trunk(p, s),
        graph_owner(graph_in(arena)),
        g(*graph_owner),
        trunk_reader(trunk_reader_options()),
        expert_reader(expert_reader_options(s.expert_window_bytes())) {
    head = src.load_head();
    if (src.has_experts()) {
      const uint64_t slots = p.inflight_slots + p.lookahead_slots + p.cache_slots;
      const uint64_t widen = src.expert_widen_floats();
      cache = std::make_unique<ExpertCache>(
          slots, p.expert_slot_bytes - io::align_up(4 * widen, io::kDirectAlign), widen, n, c.n_experts);
      slot_reads = std::make_unique<SlotRead[]>(slots);
    }
    for (int l = 0; l < n; ++l)
      if (trunk.pinned(l)) pin_total_bytes += trunk.bytes(l, -1).size();
    if (strategy == Strategy::automatic) {
      tuner.emplace();
      prefetch_on = tuner->prefetch();
    }
    build();
    for (int s = 0; s < trunk.ring_slots(); ++s) trunk_free->try_put(s);
    g.wait_for_all();
  }

  ~Impl() {
    trunk_reader.wait_idle();
    expert_reader.wait_idle();
    g.wait_for_all();
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
    if (compute) act.compute_begin();
    {
      TraceSpan span(*tracks[id], kNodeNames[id], compute ? "compute" : "graph", args);
      try {
        body();
      } catch (const std::exception& e) {
        fail(e.what());
      }
    }
    if (compute) act.compute_end();
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

  int layer_of(uint64_t visit) const { return int(visit % uint64_t(n)); }

  void counters();  // the trace's slot and resident-bytes counters (nothing when tracing is off)

  // ------------------------------------------------------------------ trunk reads

  // Reads visit `visit`'s layer into its ring slot (or pin region, slot < 0); the gateway gets
  // TrunkReady when the last extent lands.
  void submit_trunk(uint64_t visit, int layer, int slot, TrunkReadNode::gateway_type& gw);

  // Puts visit v's trunk on its way: a loaded pin is ready now, an unloaded one is read into its
  // region, a ring layer is scheduled (one part per slot it takes).
  template <class Job, class Claim, class Ready>
  void request_layer(uint64_t v, Job&& job, Claim&& claim, Ready&& ready) {
    const int l = layer_of(v);
    if (trunk.pinned(l)) {
      if (trunk.pin_loaded(l))
        ready(TrunkReady{v, l, -1});
      else
        claim(TrunkClaim{TrunkJob{v, l, 0}, -1});
      return;
    }
    const int parts = l == trunk.spanning_layer() ? trunk.ring_slots() : 1;
    for (int p = 0; p < parts; ++p) job(TrunkJob{v, l, p});
  }

  void schedule_ring(int call_index);  // queues every ring layer's read jobs for that forward call

  // ------------------------------------------------------------------ experts

  // Reads a batch of claimed expert slots, sorted by file offset; the gateway gets ExpertLanded per
  // slot when its last chunk lands.
  void submit_experts(const ReadBatch& b, ExpertReadNode::gateway_type& gw);

  // ------------------------------------------------------------------ the graph

  // Registers node `id` with the DOT description (or its own statistics) and its trace row.
  NodeStats& describe(Node id, const char* kind, int concurrency, const char* cluster) {
    const int threads = int(tbb::global_control::active_value(tbb::global_control::max_allowed_parallelism));
    tracks[id] = std::make_unique<TraceTrack>(fmt::format("node: {}", kNodeNames[id]),
                                              concurrency == 0 ? std::min(2 * threads, 64) : 1);
    if (dot) return dot->add_node(kNodeNames[id], kind, concurrency, cluster);
    return own_stats[id];
  }

  void build();
  void prepare_call(stages::DecodeState& st, size_t T, std::span<float> logits);
};

}  // namespace k3::pipeline
