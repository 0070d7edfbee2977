// clang-format off
// Streaming decode as a oneTBB flow graph (docs/design.md §4). Built once per run from the plan,
// reused for every forward call; messages carry handles (a Visit = (step, layer), a slot, an expert
// group), never weights, each edge with a type of its own; every weight byte lives in a slot of a
// pool the planner sized.
//
// Batching: one decode *step* carries B sequences (forward_batch), each with its own KV cache / KDA
// state and position: their rows concatenated. A trunk layer is read once per step and applied to
// all B of them; the routed experts a layer reads are the union over the step's tokens, each
// computed once over the rows (of every sequence) that chose it; only the attention node runs per
// sequence, the head at each sequence's last row. Messages name their step, and the per-step state
// -- activations (CallBuffers), the layer in progress, its MoE run (MoeLayerRun) -- is a StepState
// found from the message's Visit, so several steps could be in flight; today the driver runs one
// step at a time.
//
// Where it is: graph_messages.hpp (Visit, SlotRef, per-edge messages, node ids, named ports),
// graph_nodes.hpp (the nodes: one table that build() reads), graph_wiring.hpp (the edges: one table
// that make_edge and the DOT dump both read), graph_nodes.cpp (one member function per node body),
// moe_layer_run.* (expert waves, claims, retries), call_buffers.* (a step's activations),
// graph_io.cpp (the reads), graph.cpp (build(): the nodes, then the edges; and this class),
// graph_impl.hpp (the state).
//
//  trunk_schedule ─┐
//  trunk_free ─────┴► trunk_claim (join) ► trunk_read (async, io_uring) ► trunk_bind ─┐
//                                                                                    ├► layer_gate (key = visit)
//  layer_go (hidden state of visit v, from layer_done or the driver) ─────────────────┘      │
//      ┌──────────────────────────────────────────────────────────────────────────────────┘
//      └► attention ─► dense_ffn ─────────────────────────────────────────► layer_done
//                   └► router ─► expert_fetch (cache lookup, claims) ─► expert_read (async, io_uring)
//                             │          │ hits                                 │ landed
//                             │          └──────────────► expert_landed ◄────────┘ (bind, waves)
//                             │                                   │
//                             └► shared (latent z, shared experts)│
//                                      │ latent ready per expert  ▼
//                                      └──────────────► expert_join (key = visit, expert group)
//                                                                 ▼
//                                  expert_compute (each expert as its bytes land) ─► combine
//                                                                                     ▼
//  A compressed trunk (pack-trunk --codec exp4|exp3|huff) adds the decode stage, made only then (the raw
//  graph above is unchanged; graph_wiring.hpp marks the edges kRawTrunk / kCompressedTrunk):
//   trunk_read ► stored_order (sequencer: read order) ─┐
//   decode_free (decoded slot ids) ────────────────────┴► decode_claim (join) ► trunk_decode ► trunk_bind
//  trunk_decode decodes the stored layer (parallel_for over its codec blocks) into the decoded slot
//  -- a pinned layer into its pin region, once -- and returns the ring slot(s) to trunk_free;
//  layer_done returns the decoded slot to decode_free. exp4, exp3 (fused decode): a streamed layer's
//  projections are bound coded over its stored bytes and decoded inside the matvecs, so its ring
//  slot(s) go back from layer_done instead, and trunk_decode decodes only the rest of the layer.
//  One rank of several (expert parallel, docs/distributed.md §6) adds expert_exchange, made only
//  then (graph_wiring.hpp marks the edges kOneProcess / kRanks): the rank's MoeLayerRun holds only
//  the groups of the experts it owns (so only they are fetched, read, cached and computed), and
//  the layer's last piece goes through the exchange (one allgatherv: its rows out, every other
//  rank's rows in) to combine, which sums all top_k slots in order as in one process:
//   shared / expert_compute / lookahead ─ last piece ► expert_exchange ► combine
//  layer_done: returns the trunk slot to trunk_free, sends layer_go(v + 1) or, after the last
//  layer, head (model-level AttnRes + lm_head). expert_compute releases expert slots and sends
//  expert_fetch a retry when a layer needs more experts than slots are free (waves).
//  lookahead (strategy lookahead): after expert_fetch(L), layer L+1's router scores L's FFN input and
//  prefetches the predicted experts into unpinned slots.
//
// Exactness: arithmetic never depends on completion order. The key-matching layer_gate admits visit
// v only with the hidden state layer v-1 produced, so layers run in order whatever order their reads
// land in; each expert writes only its own rows of the [T][top_k] expert-output buffer and
// moe_combine sums them strictly in top-k order; every function called is the one the resident
// forward pass calls (stages/), so the logits are the resident ones bit for bit.
//
// Design decisions, each with its reason (docs/design.md §4 has the whole picture):
//  - Expert slots are one pool, not three. The plan's in-flight, lookahead and cache slots are a
//    single LRU arena with pin counts: whatever the current layer does not pin is cache, and a
//    prefetch can only take unpinned slots, so lookahead can never starve the layer being computed.
//    A fixed split would leave slots idle at the floor, where every slot matters.
//  - Expert slots are gated by the cache, not a token queue: a hit pins a slot that was already
//    "free" for eviction, which a queue of free-slot tokens cannot express. expert_fetch claims what
//    it can and is re-sent a retry whenever a slot is released or a prefetch lands; a layer whose
//    unique experts exceed the free slots (prefill at the floor) runs in waves, exactly.
//  - The spanning layer (planner.hpp) takes the whole ring, not `span_slots` of it (slot_pool.hpp).
//  - Reads run ahead across forward calls: the next call's ring reads are queued behind this call's,
//    gated only by free slots, so the ring does not drain at token boundaries (trunk reads do not
//    depend on the token). expect_calls() bounds it. A call returns as soon as its head has run,
//    not when the graph is idle (that waited for the next call's reads: 15-23 ms per token).
//  - Lookahead is counted as a piece of layer L (it reads L's FFN input), so the next attention cannot
//    overwrite that input under it; it never waits for a read.
//  - Two io_uring readers (trunk, experts), one ring and one reaper thread each, so an expert batch
//    never queues behind a 2 GB trunk read; both are O_DIRECT through 4096-aligned windows.
//  - Expert reads are made to land one after another (about one expert in flight: 4 chunks of a
//    quarter expert), not all at once. With a whole batch in flight the experts shared the device
//    and landed together at the end, so "compute each expert as it lands" computed nothing early.
//    Medium synthetic checkpoint at 1 GiB, s/token after the prefill, median of 3: overlap 0.069 ->
//    0.060, lookahead 0.078 -> 0.063.
//  - Reads are sorted by file offset within a batch (docs/engine.md §3.5), and a batch is submitted in
//    one call, but the readers' order is the compute order: the current layer's misses are urgent
//    and overtake queued lookahead prefetches; the trunk reader keeps only 4 x 1 MiB in flight, so
//    an expert read never waits behind a whole layer (reader_options.cpp); and a node that starts
//    reads spawns them last, so its thread submits them before it computes what hides them.
//  - A compressed trunk's layers are decoded in READ order (stored_order: a sequencer on the read's
//    submission number), which is the compute order: reads may land out of order, and a later layer
//    that took the last decoded slot would wait forever for an earlier one. The ring slot is given
//    back right after the decode (huff; exp4 and exp3 keep it to the layer's end: fused decode), so
//    the reader runs ahead on stored bytes while the decoded slots (1 at the floor, 2 when the plan
//    has room: decode of L+1 beside compute of L) gate the compute. (Fused: the plan's room buys a
//    third ring slot instead, so reads still run two layers ahead.)
//    Pinned layers' first reads are staged through the ring (one larger than a slot takes the whole
//    ring), so every byte is in a pool the planner counted. Block checks are verified on a layer's
//    first decode in the process (as the raw trunk's xxh64 is checked once: check_loaded, which
//    trunk_bind also applies to the decoded bytes).
//  - The graph allocates no weight memory after construction. Activations (T-sized) grow only when a
//    call feeds more tokens than any before (full recompute), never in incremental decode.
//
// Strategies (all bit-identical): serial (never a read and a compute at once: a wave of expert reads
// all lands before it is bound and computed, the next wave and the next layer are read only after,
// and a node that starts a read is sent its message after the compute span before it has closed;
// tests/test_streaming_trace.cpp checks it in the trace), trunk (ring ahead; experts read after
// routing and all awaited, then shared + experts computed), overlap (expert reads async, shared
// experts and latent computed while they load, each expert computed as it lands), lookahead (overlap
// + next-layer expert prefetch), auto (the default: lookahead's graph with the prefetch switched
// on or off between decode steps by PrefetchTuner, from what the steps cost).
// clang-format on
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "pipeline/graph/activity.hpp"
#include "pipeline/graph/cache_policy.hpp"
#include "pipeline/graph/graph_dot.hpp"
#include "pipeline/graph/planner.hpp"
#include "pipeline/graph/routing_trace.hpp"
#include "pipeline/graph/streaming_source.hpp"
#include "stages/forward.hpp"
#include "stages/moe.hpp"

namespace k3::pipeline {

// automatic ("auto", the default): the lookahead graph, whose expert prefetch a PrefetchTuner turns on
// or off from the measured cost of this run's own decode steps (pipeline/graph/prefetch_tuner.hpp).
enum class Strategy { serial, trunk, overlap, lookahead, automatic };
Strategy parse_strategy(std::string_view name);  // usage Error listing the names
const char* strategy_name(Strategy);

struct StreamTotals {
  uint64_t trunk_bytes_read = 0, expert_bytes_read = 0;  // bytes read (a compressed trunk: stored bytes)
  // a compressed trunk: the decode stage's output (decoded bytes) and its wall time (0 when raw)
  uint64_t trunk_decoded_bytes = 0;
  double decode_seconds = 0;
  std::string codec = "none";
  uint64_t expert_requests = 0, expert_hits = 0;  // hits include experts a prefetch had read / was reading
  uint64_t lookahead_predicted = 0;               // prefetch reads issued
  uint64_t lookahead_used = 0;                    // of those, experts the router then chose
  uint64_t uring_bytes = 0, pread_bytes = 0, direct_bytes = 0;
  double io_busy_seconds = 0, compute_busy_seconds = 0;
  bool uring = false;     // both readers on io_uring
  std::string automatic;  // strategy auto: what its tuner chose and why (PrefetchTuner::describe)
};

class StreamingModel {
 public:
  // `dot` (may be null) receives the graph as built and its per-node statistics as it runs.
  // `exchange` (expert parallel, docs/distributed.md §6): this process is one rank of several; it
  // reads and computes only the routed experts exchange->owns(), and the graph gets the
  // expert_exchange node between a MoE layer's last piece and its combine (null: one process, the
  // graph without it). The plan should be the rank's (plan_rank_experts).
  // `policy`: the expert cache's replacement policy (cache_policy.hpp); it changes what is read, never
  // the bits. `threads`: the graph's arena, where its nodes and their kernels run (the command's
  // --threads; 0: oneTBB's default concurrency); it never changes the bits either.
  StreamingModel(const WeightSources&, const MemoryPlan&, Strategy, GraphDescription* dot,
                 stages::ExpertExchange* exchange = nullptr, ExpertPolicy policy = kDefaultExpertPolicy,
                 int threads = 0);
  ~StreamingModel();
  StreamingModel(const StreamingModel&) = delete;
  StreamingModel& operator=(const StreamingModel&) = delete;

  // stages::forward(..., HeadAt::last, ...) with streamed weights: feeds `ids` at state.cached..,
  // writes the last position's vocab logits, advances state.cached. Throws io::Error naming the
  // file on a read failure (the engine is then unusable). Test hook: K3FLOW_TEST_STEP_DELAY_MS=N
  // sleeps N ms before every call but the first (a test changes files under a running decode).
  // Reader tuning for experiments: K3FLOW_{TRUNK,EXPERT}_{QD,CHUNK_KB}.
  // HeadAt::all: every row's logits (ids.size() x vocab), a speculative verify pass.
  void forward(stages::DecodeState&, std::span<const int32_t> ids, std::span<float> logits,
               stages::HeadAt head_at = stages::HeadAt::last);
  // One step over several sequences (stages::forward_batch with streamed weights): the segments'
  // ids concatenated; every trunk layer is read once for all of them, a layer's routed experts are
  // the union of its rows' choices, each computed once over the rows that chose it; the attention
  // runs per segment on its own state. logits: segments.size() x vocab, each segment's last row.
  // HeadAt::all (one segment only): every row's logits, T x vocab.
  void forward_batch(std::span<const stages::Segment>, std::span<const int32_t> ids, std::span<float> logits,
                     stages::HeadAt head_at = stages::HeadAt::last);
  // How many forward calls the run will make; reads run ahead into the next call only below it.
  void expect_calls(int n);

  // From now on, append every call's routing (each MoE layer's top-k per position) to `path` in the
  // routing-trace format (routing_trace.hpp): one pass per call. Truncates the file.
  void record_routing(const std::string& path);
  // bench --routing-replay (routing_trace.hpp, RoutingReplay): every MoE layer's top-k is taken from
  // `trace` instead of the router's; the ids and logits are then not the model's.
  void replay_routing(RoutingTrace trace);
  const StepStats& last_step() const;
  StreamTotals totals() const;
  uint64_t allocated_bytes() const;  // head + trunk ring + pinned + expert arena

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace k3::pipeline
