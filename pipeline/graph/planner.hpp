// The memory planner (docs/design.md §3, docs/engine.md §3.1-3.2, §4): one budget, split once into pools.
//
//   1. always resident: embedding + lm_head + head vectors, KDA recurrent/conv state (KDA layers
//      only), MLA KV cache for the requested context, activation scratch, tensor index, reader rings;
//   2. expert in-flight slots: top_k (one MoE layer's experts being read / computed);
//   3. trunk ring: S >= 2 uniform slots (unless the whole trunk is pinned);
//   4. expert lookahead slots: top_k more, when the budget allows;
//   5. pinned trunk layers: largest first, iterated to a fixed point (each pin can shrink the slot);
//      then, among layers of one size, the streamed ones spread out over the token (each as far as
//      it can be from the others: a run of pinned layers lets the ring fill and the disk idle);
//   6. expert cache: whatever is left, in whole expert slots.
// 1-3 are the floor; a budget below it is refused naming the missing bytes.
// No pool is larger than the model can use: pins stop at every layer (and then there is no ring),
// expert slots at one per routed expert of the planned layers. A budget past the model's size is
// left unassigned, never allocated: the plan says so ("left unallocated").
//
// Slot sizing: a slot is the largest unpinned layer's read bytes (4096-multiples) plus its widen
// area, EXCEPT that one outlier layer may span adjacent slots of the ring arena: the slot is
// max(second-largest unpinned layer, largest / S). For K3 this is layer 0 (dense FFN, 2.34 GB vs
// 1.27 GB for the next): without it the floor is 2 x 2.34 GB of ring and no 8 GiB plan exists
// (docs/engine.md §3.3, the split-first arena of the C fork). The price: while the spanning layer is
// read or computed no other trunk layer is in memory, so two trunk reads per token do not overlap
// compute. The graph must allocate the ring as one arena of S x slot_read_bytes so that adjacent
// slots are contiguous; a spanning layer takes slots [0, span). So a plan with a spanning layer is
// kept only when pinning that layer instead does not fit, or would stream more than 1.25 x its bytes
// per token (then the layers around it are re-pinned from scratch to a fixed point).
//
// Compressed trunk (PlanInputs::codec, docs/codec.md): the reader reads a layer's STORED bytes, and
// the graph's decode stage decodes them into a decoded slot, where the layer is bound and computed:
//   - the ring's slots hold stored bytes (no widen area), sized as above over the stored sizes; a
//     pinned layer's first read is staged through the ring too (a pinned layer larger than a slot
//     takes the whole ring, so the ring is at least the largest pinned stored layer / S per slot);
//     when every layer is pinned the ring is one slot of the largest stored layer, for those reads;
//   - D decode slots, each the largest streamed layer's decoded bytes + widen area (no spanning
//     here: a decoded slot holds any streamed layer): D = 1 at the floor, 2 when the budget has room
//     (decode of layer L+1 then overlaps compute of L);
//   - pinned layers are held decoded (decoded once, on their first read).
// exp4 and exp3 (fused decode, docs/codec.md; fused_codec()): a streamed layer keeps its ring slot
// until it is computed (its projections decode from the stored bytes inside the matvecs), so reads
// run only S - 1 layers ahead: instead of a second decode slot, a budget with room beside the floor
// gets a third ring slot (the ring has then max(3, --ring) slots; the floor is still --ring's).
// Every pin only shrinks both pools, so the pinning loop below keeps its invariant.
//
// All byte counts are exact (no guessed constants): they come from the config, the shard index
// and, when given, the packed trunk. Budgets are in GiB (2^30 B), as RAM and cgroup limits are.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "io/config.hpp"
#include "io/safetensors.hpp"

namespace k3::io {
class PackedTrunk;
}

namespace k3::pipeline {

struct LayerFootprint {
  uint64_t read_bytes = 0;    // bytes read into a slot (the packed layer, a 4096-multiple); decoded size
  uint64_t widen_bytes = 0;   // f32 area the binder widens vectors into, beside the read bytes
  uint64_t stored_bytes = 0;  // a compressed trunk's read length (4096-multiple); 0: raw (read_bytes)
};

// A named amount of memory: count x each (each == 0 when the items differ in size).
struct PlanTerm {
  std::string name;
  uint64_t count = 0;
  uint64_t each = 0;
  uint64_t bytes = 0;
};

// What the planner needs to know about a model, in bytes. Built from a checkpoint by
// plan_inputs(); unit tests write it by hand.
struct PlanInputs {
  std::vector<LayerFootprint> layers;  // index = zero-based layer
  std::vector<PlanTerm> resident;      // always-resident terms, in print order
  uint64_t expert_bytes = 0;           // one routed expert on disk (0: no routed experts)
  int top_k = 0;
  uint64_t routed_experts = 0;  // routed experts over the planned layers: at most this many slots (0: no cap)
  // The carried state one sequence holds (KDA + conv state, MLA KV cache for the context) and how
  // many sequences the resident terms hold it for (a batched run: max_seqs slots); 0: not known.
  uint64_t seq_kda_bytes = 0, seq_kv_bytes = 0, context = 0;
  int max_seqs = 1;
  // Rows one forward pass carries at most (pass_rows()): the activation terms are sized for it, and
  // the engine splits a longer prefill or step into passes of at most this many; 0: not known.
  uint64_t pass_rows = 0;
  std::string codec;  // the packed trunk's codec ("" or "none": raw); see "Compressed trunk" above
  // A fused codec: the bytes a decoded slot holds -- the 4 KiB pages the decode stage writes of
  // any layer (io::staged_blocks; their union over the layers, as one slot serves them all).
  // 0: unknown (a decoded slot is a whole layer).
  uint64_t fused_slot_bytes = 0;
  bool compressed() const { return !codec.empty() && codec != "none"; }
};

struct PlanBudget {
  // Either one total, or (when split) separate trunk (ring + pins) and expert (slots + cache)
  // budgets on top of the resident terms.
  uint64_t total = 0;
  std::optional<uint64_t> trunk, experts;
  std::string source;  // how it was asked for, for the printout
  int ring_slots = 2;
  bool lookahead = true;
};

struct MemoryPlan {
  PlanBudget request;
  uint64_t budget = 0;          // total bytes available (split: resident + trunk + experts)
  uint64_t floor = 0;           // smallest budget that plans (resident + in-flight experts + minimal ring)
  std::vector<PlanTerm> pools;  // everything allocated, in print order; sum == total()

  // trunk
  int n_layers = 0;
  int ring_slots = 0;  // 0 when every layer is pinned (resident trunk)
  uint64_t slot_read_bytes = 0, slot_widen_bytes = 0;
  int spanning_layer = -1;                       // the one unpinned layer larger than a slot (-1: none)
  int span_slots = 0;                            // adjacent slots it occupies
  std::vector<int> pinned;                       // ascending
  uint64_t trunk_bytes = 0, streamed_bytes = 0;  // whole trunk; unpinned part read every token
  // compressed trunk: the ring holds stored bytes, `decode_slots` slots hold decoded layers
  std::string codec;     // "" when raw
  int decode_slots = 0;  // 0 when raw (or every layer pinned)
  uint64_t decode_slot_bytes = 0, decode_widen_bytes = 0;
  // Fused codec with PlanInputs::fused_slot_bytes: each decoded slot spans this many bytes of
  // address space (the largest streamed layer), of which only decode_slot_bytes are ever written
  // (and resident); 0: decoded slots are plain memory.
  uint64_t decode_slot_span = 0;
  uint64_t streamed_stored_bytes =
      0;  // bytes a token reads of the streamed layers (stored, or raw read bytes)

  // experts
  uint64_t expert_slot_bytes = 0;
  uint64_t inflight_slots = 0, lookahead_slots = 0, cache_slots = 0;
  uint64_t routed_experts = 0;  // PlanInputs::routed_experts

  // carried state: PlanInputs' per-sequence figures (already among the pools, max_seqs times)
  uint64_t seq_kda_bytes = 0, seq_kv_bytes = 0, context = 0;
  int max_seqs = 1;
  uint64_t pass_rows = 0;  // PlanInputs::pass_rows: the most rows a forward pass may carry (0: no cap)

  uint64_t total() const;
  // Every layer pinned and a slot for every routed expert: the whole model is resident.
  bool holds_model() const;
  uint64_t unassigned() const { return budget - total(); }
};

// A codec the graph decodes inside the matvecs (exp4, exp3): io::codec::fused_decode by name.
bool fused_codec(std::string_view codec);

// Throws usage Error (one line: budget, floor, missing bytes) when the budget is below the floor.
MemoryPlan make_plan(const PlanInputs& in, const PlanBudget& budget);

// The smallest budget make_plan accepts for these inputs.
uint64_t plan_floor(const PlanInputs& in, int ring_slots = 2);

// Preset name -> total budget in bytes: laptop 8, desktop 32, workstation 96, server 128, max 224
// GiB; "ultra" is the floor itself (for a ring of `ring_slots`). Throws usage Error listing the
// names for an unknown one.
uint64_t preset_budget(std::string_view name, const PlanInputs& in, int ring_slots = 2);
std::vector<std::string> preset_names();

// Expert parallel (docs/distributed.md §6): one rank of `ranks` plans its own slice. Its expert slots
// stop at the routed experts it owns (`owned_per_layer` of every MoE layer's), and the expert
// exchange's two buffers -- this rank's rows out, every rank's rows in, each at most a pass's rows
// x top_k x latent floats (exchange_buffer_bytes) -- are resident terms. Nothing for a dense model.
void plan_rank_experts(PlanInputs& in, const io::ModelConfig& config, int owned_per_layer, int ranks);
uint64_t exchange_buffer_bytes(const io::ModelConfig& config, uint64_t context, int max_seqs);

// Rows one forward pass carries at most: max(min(context, kPassRows), max_seqs) -- every
// sequence's single id fits one pass; a prompt longer than kPassRows is fed in several (a chunked
// prefill gives the bits of a whole one).
inline constexpr uint64_t kPassRows = 64;
uint64_t pass_rows(uint64_t context, int max_seqs);

// The activation terms of a run (planner.cpp): the streaming graph's CallBuffers for its largest
// pass (call_buffer_bytes: the very layout CallBuffers::prepare carves; `moe`: the bound layers
// have routed experts), the f64 copies kernels::matmul makes of its inputs during such a pass
// (widened_input_bytes: the largest set that can be live at once), and the pass's logits rows (one
// per sequence; --spec's further verify rows are spec_plan_terms').
std::vector<PlanTerm> scratch_terms(const io::ModelConfig& config, uint64_t context, int max_seqs, bool moe,
                                    int spec = 0);
uint64_t widened_input_bytes(const io::ModelConfig& config, uint64_t rows, uint64_t heads);

std::string format_plan(const MemoryPlan& plan);  // the human table
std::string plan_json(const MemoryPlan& plan);    // one JSON object; pools sum to "total"

}  // namespace k3::pipeline
