#include "pipeline/graph/planner.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <numeric>
#include <utility>

#include "io/aligned.hpp"
#include "io/codec/codec.hpp"
#include "io/error.hpp"
#include "io/json_text.hpp"
#include "io/safetensors_writer.hpp"
#include "io/uring_reader.hpp"
#include "pipeline/graph/call_buffers.hpp"
#include "pipeline/graph/reader_options.hpp"
#include "pipeline/support/human_bytes.hpp"

namespace k3::pipeline {

namespace {

constexpr uint64_t kGiB = uint64_t{1} << 30;
using io::align_up;
using io::kDirectAlign;

uint64_t footprint(const LayerFootprint& l) {
  return align_up(l.read_bytes, kDirectAlign) + align_up(l.widen_bytes, kDirectAlign);
}

struct Ring {
  int slots = 0;
  uint64_t read = 0, widen = 0;
  int spanning = -1, span = 0;
  uint64_t bytes() const { return uint64_t(slots) * (read + widen); }
};

// The ring for the unpinned layers: S uniform slots; one outlier may span up to S adjacent slots.
Ring ring_for(const std::vector<LayerFootprint>& layers, const std::vector<bool>& pinned, int S) {
  Ring r;
  int big = -1;
  uint64_t a1 = 0, a2 = 0, widen = 0;
  for (size_t l = 0; l < layers.size(); ++l) {
    if (pinned[l]) continue;
    uint64_t b = align_up(layers[l].read_bytes, kDirectAlign);
    widen = std::max(widen, align_up(layers[l].widen_bytes, kDirectAlign));
    if (big < 0 || b > a1) {
      a2 = big < 0 ? 0 : a1;
      a1 = b;
      big = int(l);
    } else {
      a2 = std::max(a2, b);
    }
  }
  if (big < 0) return r;  // everything pinned: no ring
  r.slots = S;
  r.widen = widen;
  r.read = std::max(a2, align_up((a1 + S - 1) / S, kDirectAlign));
  if (a1 > r.read) {
    r.spanning = big;
    r.span = int((a1 + r.read - 1) / r.read);
  }
  return r;
}

// The trunk's pools for a pinning: the ring, and for a compressed trunk the decode slots
// (planner.hpp, "Compressed trunk"). `D` decode slots (compressed only).
struct Pools {
  Ring ring;
  int dec = 0;
  uint64_t dec_read = 0, dec_widen = 0;
  uint64_t dec_span = 0;  // fused, compact decoded slots: their address span (dec_read is resident)
  uint64_t bytes() const { return ring.bytes() + uint64_t(dec) * (dec_read + dec_widen); }
};

// `fused_slot`: PlanInputs::fused_slot_bytes (0: a decoded slot holds a whole layer).
Pools pools_for(const std::vector<LayerFootprint>& layers, const std::vector<bool>& pinned, int S, int D,
                bool compressed, uint64_t fused_slot = 0) {
  Pools p;
  if (!compressed) {
    p.ring = ring_for(layers, pinned, S);
    return p;
  }
  std::vector<LayerFootprint> stored(layers.size());
  uint64_t pin_max = 0;
  bool streamed = false;
  for (size_t l = 0; l < layers.size(); ++l) {
    const uint64_t b = align_up(layers[l].stored_bytes, kDirectAlign);
    stored[l] = LayerFootprint{.read_bytes = b, .widen_bytes = 0, .stored_bytes = b};
    if (pinned[l]) {
      pin_max = std::max(pin_max, b);
    } else {
      streamed = true;
      p.dec_read = std::max(p.dec_read, align_up(layers[l].read_bytes, kDirectAlign));
      p.dec_widen = std::max(p.dec_widen, align_up(layers[l].widen_bytes, kDirectAlign));
    }
  }
  if (!streamed) {  // every layer pinned: one ring slot stages their first reads
    p.dec_read = p.dec_widen = 0;
    if (pin_max) p.ring = Ring{.slots = 1, .read = pin_max, .widen = 0, .spanning = -1, .span = 0};
    return p;
  }
  if (fused_slot) p.dec_span = std::exchange(p.dec_read, fused_slot);
  p.ring = ring_for(stored, pinned, S);
  const uint64_t stage = align_up((pin_max + uint64_t(S) - 1) / uint64_t(S), kDirectAlign);
  if (stage > p.ring.read) {  // a pinned layer's first read must fit the whole ring
    p.ring.read = stage;
    if (p.ring.spanning >= 0) {
      const uint64_t a1 = stored[size_t(p.ring.spanning)].read_bytes;
      p.ring.span = int((a1 + p.ring.read - 1) / p.ring.read);
      if (p.ring.span <= 1) p.ring.spanning = -1, p.ring.span = 0;
    }
  }
  p.dec = D;
  return p;
}

// Among layers of one size, which of them are pinned changes no byte count, but it decides where the
// streamed layers fall in the token. Pinned lowest-index first, they bunched: on the 16-layer `wide`
// synthetic at 0.8 GiB (streamed 3, 7, 9..15) the reader filled both ring slots while layers 0..3
// computed, then sat idle -- no read in flight for 6-7 % of the decode. So within each size class
// the streamed layers are re-chosen one at a time, each the candidate farthest (cyclically: the
// token wraps to the next one's layer 0) from every layer already streamed; ties go to the lower
// index. The same sizes stay unpinned, so the ring and every total are unchanged.
void spread_pins(const std::vector<LayerFootprint>& layers, std::vector<bool>& pinned) {
  const int n = int(layers.size());
  // (a compressed layer's stored size is part of its size: the ring holds stored bytes)
  std::map<std::tuple<uint64_t, uint64_t, uint64_t>, std::vector<int>> same_size;
  for (int l = 0; l < n; ++l)
    same_size[{align_up(layers[size_t(l)].read_bytes, kDirectAlign),
               align_up(layers[size_t(l)].widen_bytes, kDirectAlign),
               align_up(layers[size_t(l)].stored_bytes, kDirectAlign)}]
        .push_back(l);
  std::vector<int> streamed;  // fixed so far
  std::vector<std::vector<int>*> partial;
  std::vector<size_t> want;
  for (auto& [size, idx] : same_size) {
    const size_t s = size_t(std::count_if(idx.begin(), idx.end(), [&](int l) { return !pinned[size_t(l)]; }));
    if (s == idx.size()) streamed.insert(streamed.end(), idx.begin(), idx.end());
    if (s == 0 || s == idx.size()) continue;
    partial.push_back(&idx);
    want.push_back(s);
  }
  auto gap = [&](int l) {
    int d = n;
    for (int x : streamed) d = std::min({d, std::abs(l - x), n - std::abs(l - x)});
    return d;
  };
  for (size_t c = 0; c < partial.size(); ++c) {
    std::vector<int>& idx = *partial[c];
    for (int l : idx) pinned[size_t(l)] = true;
    for (size_t k = 0; k < want[c]; ++k) {
      int best = -1, best_gap = -1;
      for (int l : idx)
        if (pinned[size_t(l)] && gap(l) > best_gap) best = l, best_gap = gap(l);
      pinned[size_t(best)] = false;
      streamed.push_back(best);
    }
  }
}

uint64_t sum_terms(const std::vector<PlanTerm>& ts) {
  return std::accumulate(ts.begin(), ts.end(), uint64_t{0},
                         [](uint64_t s, const PlanTerm& t) { return s + t.bytes; });
}

uint64_t expert_slot(uint64_t expert_bytes) {
  // + one page: an expert that does not start on a 4096 boundary is read as its enclosing window.
  return expert_bytes ? align_up(expert_bytes, kDirectAlign) + kDirectAlign : 0;
}

}  // namespace

bool fused_codec(std::string_view codec) {
  const auto c = io::codec::parse_codec(codec);
  return c && io::codec::fused_decode(*c);
}

uint64_t MemoryPlan::total() const {
  return sum_terms(pools);
}

bool MemoryPlan::holds_model() const {
  const uint64_t slots = inflight_slots + lookahead_slots + cache_slots;
  return int(pinned.size()) == n_layers &&
         (expert_slot_bytes == 0 || (routed_experts && slots >= routed_experts));
}

uint64_t plan_floor(const PlanInputs& in, int ring_slots) {
  std::vector<bool> none(in.layers.size(), false);
  uint64_t all = 0;
  for (const LayerFootprint& l : in.layers) all += footprint(l);
  uint64_t ring = pools_for(in.layers, none, ring_slots, 1, in.compressed(), in.fused_slot_bytes).bytes();
  if (in.compressed()) {  // everything pinned instead: plus the one staging slot
    std::vector<bool> every(in.layers.size(), true);
    all += pools_for(in.layers, every, ring_slots, 1, true, in.fused_slot_bytes).bytes();
  }
  ring = std::min(ring, all);
  return sum_terms(in.resident) + uint64_t(in.top_k) * expert_slot(in.expert_bytes) + ring;
}

namespace {

// ---- make_plan's steps, in the order it takes them

// The plan's copies of its inputs and request, the floor, the expert slot size and the trunk's bytes.
MemoryPlan plan_basics(const PlanInputs& in, const PlanBudget& want) {
  MemoryPlan p;
  p.request = want;
  const uint64_t resident = sum_terms(in.resident);
  p.budget = want.trunk.has_value() ? resident + *want.trunk + want.experts.value_or(0) : want.total;
  p.floor = plan_floor(in, want.ring_slots);
  p.expert_slot_bytes = expert_slot(in.expert_bytes);
  p.n_layers = int(in.layers.size());
  p.routed_experts = p.expert_slot_bytes ? in.routed_experts : 0;
  p.seq_kda_bytes = in.seq_kda_bytes;
  p.seq_kv_bytes = in.seq_kv_bytes;
  p.context = in.context;
  p.max_seqs = in.max_seqs;
  p.pass_rows = in.pass_rows;
  for (const LayerFootprint& l : in.layers) p.trunk_bytes += footprint(l);
  return p;
}

// What make_plan's steps share: the inputs, the request, and the fixed terms the budget holds
// before the trunk's pools.
struct Sizing {
  const PlanInputs& in;
  const PlanBudget& want;
  uint64_t resident = 0;  // the always-resident terms
  bool split = false;     // separate trunk and expert budgets
  uint64_t inflight = 0;  // in-flight expert slots (top_k; 0: no routed experts)
  uint64_t inflight_bytes = 0;
  uint64_t n = 0;  // layers
  bool compressed = false;
};

Sizing sizing(const PlanInputs& in, const PlanBudget& want, const MemoryPlan& p) {
  Sizing z{.in = in, .want = want};
  z.resident = sum_terms(in.resident);
  z.split = want.trunk.has_value();
  z.inflight = p.expert_slot_bytes ? uint64_t(in.top_k) : 0;
  z.inflight_bytes = z.inflight * p.expert_slot_bytes;
  z.n = in.layers.size();
  z.compressed = in.compressed();
  return z;
}

// Refuses a budget below the floor, or (split) a trunk or expert budget below its share of it.
void check_budget(const MemoryPlan& p, const Sizing& z) {
  const PlanBudget& want = z.want;
  if (p.budget < p.floor)
    throw io::usage_error(
        fmt::format("plan: budget {} ({} B, {}) is {} B short of the floor {} ({} B: resident {}, "
                    "{} expert slots, {}-slot trunk ring)",
                    human_bytes(p.budget), p.budget, want.source, p.floor - p.budget, human_bytes(p.floor),
                    p.floor, human_bytes(z.resident), z.inflight, want.ring_slots));
  if (!z.split) return;
  uint64_t ring_min = p.floor - z.resident - z.inflight_bytes;
  if (*want.trunk < ring_min)
    throw io::usage_error(fmt::format("plan: trunk budget {} is {} B short of the {}-slot ring ({} B)",
                                      human_bytes(*want.trunk), ring_min - *want.trunk, want.ring_slots,
                                      ring_min));
  if (want.experts.value_or(0) < z.inflight_bytes)
    throw io::usage_error(
        fmt::format("plan: expert budget {} is {} B short of {} in-flight expert slots ({} B)",
                    human_bytes(want.experts.value_or(0)), z.inflight_bytes - want.experts.value_or(0),
                    z.inflight, z.inflight_bytes));
}

// Trunk: what the ring + pins may use, and the lookahead slots' bytes (taken from it unless split).
struct TrunkRoom {
  uint64_t trunk_avail = 0;
  uint64_t lookahead_bytes = 0;
};

// Sets p.lookahead_slots: lookahead slots only where the cache has room for them beside the
// in-flight ones.
TrunkRoom trunk_room(MemoryPlan& p, const Sizing& z) {
  const PlanBudget& want = z.want;
  TrunkRoom r;
  r.trunk_avail = z.split ? *want.trunk : p.budget - z.resident - z.inflight_bytes;
  if (want.lookahead && z.inflight && (!z.in.routed_experts || 2 * z.inflight <= z.in.routed_experts)) {
    uint64_t ring0 = p.floor - z.resident - z.inflight_bytes;
    uint64_t room = z.split ? want.experts.value_or(0) - z.inflight_bytes : r.trunk_avail - ring0;
    if (room >= z.inflight_bytes) {
      p.lookahead_slots = z.inflight;
      r.lookahead_bytes = z.inflight_bytes;
      if (!z.split) r.trunk_avail -= r.lookahead_bytes;
    }
  }
  return r;
}

struct SlotCounts {
  int ring = 0;    // trunk ring slots (S)
  int decode = 1;  // decoded slots (D; compressed trunk only)
};

// Compressed trunk: a second decode slot when the budget has room for it beside the floor's one
// (staged codecs: decode of L+1 then overlaps compute of L). A fused codec decodes almost nothing
// in the decode stage, but its layers hold their ring slots through compute, so the room goes to a
// third ring slot instead: reads then run two layers ahead, as a raw trunk's effectively do.
SlotCounts slot_counts(const MemoryPlan& p, const Sizing& z, uint64_t trunk_avail) {
  const PlanInputs& in = z.in;
  SlotCounts c{.ring = z.want.ring_slots};
  if (z.compressed && fused_codec(in.codec)) {
    const std::vector<bool> none(z.n, false);
    if (c.ring < 3 && trunk_avail >= pools_for(in.layers, none, 3, 1, true, in.fused_slot_bytes).bytes())
      c.ring = 3;
  } else if (z.compressed) {
    const std::vector<bool> none(z.n, false);
    const Pools one = pools_for(in.layers, none, c.ring, 1, true, in.fused_slot_bytes);
    const uint64_t ring0 = p.floor - z.resident - z.inflight_bytes;
    const uint64_t extra = one.dec_read + one.dec_widen;
    if (one.dec && trunk_avail >= ring0 && trunk_avail - ring0 >= extra) c.decode = 2;
  }
  return c;
}

// Which layers are pinned, their bytes, and the trunk's pools beside them.
struct Pinning {
  std::vector<bool> pinned;
  uint64_t bytes = 0;
  Pools pools{};
};

// Largest-first pinning within `trunk_avail` for a ring of S slots and D decoded slots.
class PinSearch {
 public:
  PinSearch(const Sizing& z, SlotCounts c, uint64_t trunk_avail, uint64_t trunk_bytes)
      : in_(z.in),
        n_(z.n),
        S_(c.ring),
        D_(c.decode),
        compressed_(z.compressed),
        trunk_avail_(trunk_avail),
        trunk_bytes_(trunk_bytes),
        order_(z.n) {
    stage_all_ = pools(std::vector<bool>(n_, true)).bytes();
    std::iota(order_.begin(), order_.end(), 0);
    std::stable_sort(order_.begin(), order_.end(),
                     [&](int a, int b) { return footprint(in_.layers[a]) > footprint(in_.layers[b]); });
  }

  uint64_t n() const { return n_; }
  uint64_t trunk_bytes() const { return trunk_bytes_; }
  const std::vector<LayerFootprint>& layers() const { return in_.layers; }
  Pools pools(const std::vector<bool>& pins) const {
    return pools_for(in_.layers, pins, S_, D_, compressed_, in_.fused_slot_bytes);
  }

  // Pins largest-first to a fixed point from `x.pinned` (layers already pinned stay pinned): pins
  // only ever shrink the ring, so every pass stays within the budget, and a pass that pins nothing
  // ends the loop. False when the starting pins do not fit beside their own ring.
  bool fixed_point(Pinning& x) const {
    x.bytes = 0;
    for (size_t l = 0; l < n_; ++l)
      if (x.pinned[l]) x.bytes += footprint(in_.layers[l]);
    x.pools = pools(x.pinned);
    if (x.bytes + x.pools.bytes() > trunk_avail_) return false;
    for (bool changed = true; changed;) {
      changed = false;
      uint64_t unpinned = trunk_bytes_ - x.bytes;
      if (unpinned && unpinned + stage_all_ <= trunk_avail_ - x.bytes) {  // everything fits without a ring
        std::fill(x.pinned.begin(), x.pinned.end(), true);
        x.bytes = trunk_bytes_;
        x.pools = pools(x.pinned);
        break;
      }
      uint64_t avail = trunk_avail_ - x.bytes - x.pools.bytes();
      for (int l : order_) {
        uint64_t b = footprint(in_.layers[l]);
        if (!x.pinned[l] && b <= avail) {
          x.pinned[l] = true;
          x.bytes += b;
          avail -= b;
          changed = true;
        }
      }
      x.pools = pools(x.pinned);
    }
    return true;
  }

 private:
  const PlanInputs& in_;
  uint64_t n_;
  int S_, D_;
  bool compressed_;
  uint64_t trunk_avail_, trunk_bytes_;
  uint64_t stage_all_ = 0;  // every layer pinned: the pools (a compressed trunk's staging slot)
  std::vector<int> order_;  // layer indices, largest footprint first
};

// The pins: largest-first from none, then without a spanning layer when that is worth it, then
// spread over the token (spread_pins).
Pinning choose_pins(const PinSearch& search) {
  const uint64_t n = search.n(), trunk_bytes = search.trunk_bytes();
  Pinning pins{.pinned = std::vector<bool>(n, false)};
  search.fixed_point(pins);  // nothing pinned at the start always fits (floor)
  // A spanning layer takes the whole ring (docs/design.md §3.2): it cannot be read until the layer
  // before it in the ring has been computed, nor anything after it until it has, so the disk idles
  // for a layer's compute twice a token (docs/performance.md, "A layer that fills the ring").
  // Pinning it (and re-pinning the rest around it) usually costs a few more streamed bytes; that
  // plan is taken when it reads at most kSpanByteAllowance times the span plan's bytes per token.
  // At the floor, or when the spanning layer does not fit beside the ring, the span stays.
  constexpr double kSpanByteAllowance = 1.25;
  const uint64_t spanning_streamed = trunk_bytes - pins.bytes;
  for (std::vector<bool> alt(n, false); pins.pools.ring.spanning >= 0;) {
    alt[size_t(pins.pools.ring.spanning)] = true;
    Pinning next{.pinned = alt};
    if (!search.fixed_point(next) ||
        double(trunk_bytes - next.bytes) > kSpanByteAllowance * double(spanning_streamed))
      break;
    pins = std::move(next);
  }
  spread_pins(search.layers(), pins.pinned);
  // the same sizes unpinned: only the indices move
  pins.pools = search.pools(pins.pinned);
  return pins;
}

// The trunk's part of the plan: pinned layers, streamed bytes, decoded slots, the ring.
void record_trunk(MemoryPlan& p, const Sizing& z, const Pinning& pins) {
  const PlanInputs& in = z.in;
  const Ring& ring = pins.pools.ring;
  for (size_t l = 0; l < z.n; ++l)
    if (pins.pinned[l])
      p.pinned.push_back(int(l));
    else
      p.streamed_stored_bytes +=
          align_up(z.compressed ? in.layers[l].stored_bytes : in.layers[l].read_bytes, kDirectAlign);
  if (z.compressed) {
    p.codec = in.codec;
    p.decode_slots = pins.pools.dec;
    p.decode_slot_bytes = pins.pools.dec_read;
    p.decode_widen_bytes = pins.pools.dec_widen;
    p.decode_slot_span = pins.pools.dec ? pins.pools.dec_span : 0;
  }
  p.ring_slots = ring.slots;
  p.slot_read_bytes = ring.read;
  p.slot_widen_bytes = ring.widen;
  p.spanning_layer = ring.spanning;
  p.span_slots = ring.span;
  p.streamed_bytes = p.trunk_bytes - pins.bytes;
}

// Experts: in-flight, lookahead, then whole cache slots from what is left.
void assign_expert_slots(MemoryPlan& p, const Sizing& z, const Pinning& pins, uint64_t lookahead_bytes) {
  p.inflight_slots = z.inflight;
  uint64_t used = z.resident + pins.pools.bytes() + pins.bytes + z.inflight_bytes + lookahead_bytes;
  uint64_t left =
      z.split ? (z.want.experts.value_or(0) - z.inflight_bytes - lookahead_bytes) : p.budget - used;
  p.cache_slots = p.expert_slot_bytes ? left / p.expert_slot_bytes : 0;
  // Never more slots than routed experts: a larger budget stays unassigned, not allocated.
  if (z.in.routed_experts) {
    const uint64_t room = z.in.routed_experts > z.inflight + p.lookahead_slots
                              ? z.in.routed_experts - z.inflight - p.lookahead_slots
                              : 0;
    p.cache_slots = std::min(p.cache_slots, room);
  }
}

// Everything the plan allocates, in print order: the resident terms, then the trunk's and the
// experts' pools.
std::vector<PlanTerm> pool_terms(const MemoryPlan& p, const Sizing& z, const Pinning& pins,
                                 uint64_t lookahead_bytes) {
  const Pools& pools = pins.pools;
  const Ring& ring = pools.ring;
  std::vector<PlanTerm> t = z.in.resident;
  std::string ring_name = z.compressed ? "trunk ring slots, stored (compressed) bytes" : "trunk ring slots";
  if (ring.spanning >= 0) ring_name += fmt::format(" (layer {} spans {})", ring.spanning, ring.span);
  t.push_back({ring_name, uint64_t(ring.slots), ring.read + ring.widen, ring.bytes()});
  if (z.compressed)
    t.push_back({p.decode_slot_span ? "trunk decode slots (a fused layer's staged part)"
                                    : "trunk decode slots (decoded layers)",
                 uint64_t(pools.dec), pools.dec_read + pools.dec_widen,
                 uint64_t(pools.dec) * (pools.dec_read + pools.dec_widen)});
  t.push_back(
      {fmt::format("pinned trunk layers ({} of {})", p.pinned.size(), z.n), p.pinned.size(), 0, pins.bytes});
  t.push_back({"expert in-flight slots", z.inflight, p.expert_slot_bytes, z.inflight_bytes});
  t.push_back({"expert lookahead slots", p.lookahead_slots, p.expert_slot_bytes, lookahead_bytes});
  t.push_back(
      {"expert cache slots", p.cache_slots, p.expert_slot_bytes, p.cache_slots * p.expert_slot_bytes});
  return t;
}

}  // namespace

MemoryPlan make_plan(const PlanInputs& in, const PlanBudget& want) {
  if (want.ring_slots < 2)
    throw io::usage_error(fmt::format("plan: a trunk ring needs at least 2 slots, got {}", want.ring_slots));
  MemoryPlan p = plan_basics(in, want);
  const Sizing z = sizing(in, want, p);
  check_budget(p, z);
  const TrunkRoom room = trunk_room(p, z);
  const SlotCounts counts = slot_counts(p, z, room.trunk_avail);
  const Pinning pins = choose_pins(PinSearch(z, counts, room.trunk_avail, p.trunk_bytes));
  record_trunk(p, z, pins);
  assign_expert_slots(p, z, pins, room.lookahead_bytes);
  p.pools = pool_terms(p, z, pins, room.lookahead_bytes);
  return p;
}

std::vector<std::string> preset_names() {
  return {"ultra", "laptop", "desktop", "workstation", "server", "max"};
}

uint64_t preset_budget(std::string_view name, const PlanInputs& in, int ring_slots) {
  if (name == "ultra") return plan_floor(in, ring_slots);
  static const std::pair<const char*, uint64_t> presets[] = {
      {"laptop", 8}, {"desktop", 32}, {"workstation", 96}, {"server", 128}, {"max", 224}};
  for (const auto& [n, g] : presets)
    if (name == n) return g * kGiB;
  throw io::usage_error(fmt::format(
      "--preset: unknown preset '{}' (known: ultra, laptop, desktop, workstation, server, max)", name));
}

uint64_t pass_rows(uint64_t context, int max_seqs) {
  return std::max(std::min(std::max<uint64_t>(context, 1), kPassRows), uint64_t(std::max(max_seqs, 1)));
}

uint64_t widened_input_bytes(const io::ModelConfig& c, uint64_t rows, uint64_t heads) {
  // kernels::matmul widens its input to f64 (T rows x the matrix's columns) for as long as the
  // product runs. The graph runs one layer at a time; within a layer the attention and the dense FFN
  // are alone, while an MoE layer's shared experts, its routed experts (every group's rows at most
  // T x top_k in all) and the lookahead router (one row) may multiply at once.
  const uint64_t E = uint64_t(c.hidden), L = uint64_t(c.latent), I = uint64_t(c.moe_inter);
  const uint64_t alone = std::max({E, uint64_t(c.kda_heads) * uint64_t(c.kda_head_dim),
                                   uint64_t(c.mla_heads) * uint64_t(c.v_head), uint64_t(c.q_lora_rank),
                                   uint64_t(c.kv_lora_rank), uint64_t(c.dense_inter)});
  const uint64_t moe = c.n_experts > 0 ? rows * std::max(E, uint64_t(c.n_shared) * I) +
                                             rows * uint64_t(c.top_k) * std::max(L, I) + E
                                       : 0;
  return 8 * std::max({rows * alone, moe, heads * E});
}

std::vector<PlanTerm> scratch_terms(const io::ModelConfig& c, uint64_t context, int max_seqs, bool moe,
                                    int spec) {
  const uint64_t R = pass_rows(context, max_seqs), S = uint64_t(std::max(max_seqs, 1));
  // The pass shapes a run makes: up to R rows with a head row per sequence; a verify pass
  // (--spec) of 1 + spec rows with the head at every row. CallBuffers grows to the largest.
  uint64_t buffers = call_buffer_bytes(c, size_t(R), size_t(context), moe, size_t(S));
  uint64_t widened = widened_input_bytes(c, R, S);
  if (spec > 0) {
    const uint64_t v = uint64_t(spec) + 1;
    buffers = std::max(buffers, call_buffer_bytes(c, size_t(v), size_t(context), moe, size_t(v)));
    widened = std::max(widened, widened_input_bytes(c, v, v));
  }
  const uint64_t logits = 4 * uint64_t(c.vocab);
  return {
      {fmt::format("activation scratch ({}-row pass)", R), 1, buffers, buffers},
      {fmt::format("matmul inputs widened to f64 ({}-row pass)", R), 1, widened, widened},
      {fmt::format("pass logits ({} row{})", S, S == 1 ? "" : "s"), S, logits, S * logits},
  };
}

uint64_t exchange_buffer_bytes(const io::ModelConfig& c, uint64_t context, int max_seqs) {
  const uint64_t rows = pass_rows(context, max_seqs);  // a pass's rows
  return rows * uint64_t(c.top_k) * uint64_t(c.latent) * sizeof(float);
}

void plan_rank_experts(PlanInputs& in, const io::ModelConfig& c, int owned_per_layer, int ranks) {
  if (in.routed_experts == 0 || c.n_experts <= 0) return;
  in.routed_experts = in.routed_experts / uint64_t(c.n_experts) * uint64_t(owned_per_layer);
  const uint64_t each = exchange_buffer_bytes(c, in.context, in.max_seqs);
  in.resident.push_back(
      {fmt::format("expert exchange: send + receive (1 of {} ranks)", ranks), 2, each, 2 * each});
}

std::string format_plan(const MemoryPlan& p) {
  std::string s = fmt::format("plan: budget {} ({})\n", human_bytes(p.budget), p.request.source);
  s += fmt::format("  {:<46} {:>6}   {:>11}   {:>11}\n", "pool", "count", "each", "total");
  for (const PlanTerm& t : p.pools)
    s += fmt::format("  {:<46} {:>6} x {:>11} = {:>11}\n", t.name, t.count,
                     t.each    ? human_bytes(t.each)
                     : t.count ? "varies"
                               : "-",
                     human_bytes(t.bytes));
  s += fmt::format("  {:<46} {:>6}   {:>11}   {:>11}\n", "unassigned", "", "", human_bytes(p.unassigned()));
  s += fmt::format("  {:<46} {:>6}   {:>11}   {:>11}  of {} budget; floor {}\n", "TOTAL", "", "",
                   human_bytes(p.total()), human_bytes(p.budget), human_bytes(p.floor));
  if (p.holds_model() && p.unassigned() > 0)
    s += fmt::format(
        "  the model needs only {} of the budget (every layer pinned, every expert cached): the rest is left "
        "unallocated\n",
        human_bytes(p.total()));
  if (p.seq_kda_bytes + p.seq_kv_bytes > 0)
    s += fmt::format(
        "  carried state per sequence: {} (KDA + conv {}, MLA KV cache {} for {} positions) x {} sequence{} "
        "= {}\n",
        human_bytes(p.seq_kda_bytes + p.seq_kv_bytes), human_bytes(p.seq_kda_bytes),
        human_bytes(p.seq_kv_bytes), p.context, p.max_seqs, p.max_seqs == 1 ? "" : "s",
        human_bytes(uint64_t(p.max_seqs) * (p.seq_kda_bytes + p.seq_kv_bytes)));
  s += fmt::format("  trunk read per token: {} of {} ({} of {} layers streamed); expert slots {}\n",
                   human_bytes(p.streamed_bytes), human_bytes(p.trunk_bytes),
                   p.n_layers - int(p.pinned.size()), p.n_layers,
                   p.inflight_slots + p.lookahead_slots + p.cache_slots);
  if (!p.codec.empty()) {
    const uint64_t decoded = p.streamed_bytes;  // the streamed layers decoded (with their widen areas)
    s += fmt::format(
        "  codec {}: a token reads {} stored for {} decoded ({:.1f}% fewer bytes read); {} decode slot{} of "
        "{} "
        "(decode of layer L+1 {} compute of L); pinned layers held decoded\n",
        p.codec, human_bytes(p.streamed_stored_bytes), human_bytes(decoded),
        decoded ? 100.0 * (1.0 - double(p.streamed_stored_bytes) / double(decoded)) : 0.0, p.decode_slots,
        p.decode_slots == 1 ? "" : "s", human_bytes(p.decode_slot_bytes + p.decode_widen_bytes),
        p.decode_slots >= 2 ? "overlaps" : "waits for");
    if (fused_codec(p.codec))  // pipeline/graph/graph_nodes.cpp, trunk_decode
      s += fmt::format(
          "  fused decode ({}): a streamed layer's projections are decoded inside the matvecs from its "
          "stored bytes, which keep their ring slot until the layer is done; {} ring slots: reads run {} "
          "layer{} ahead of compute{}\n",
          p.codec, p.ring_slots, std::max(p.ring_slots - 1, 0), p.ring_slots == 2 ? "" : "s",
          p.ring_slots > p.request.ring_slots ? " (a third slot: the budget has room)" : "");
  }
  // The readers' windows: every chunk in flight lands in the slot (or pin region) it is read for, so
  // a deeper window costs no memory beyond the pools above -- only the io_uring rings, counted above.
  const io::UringReader::Options t = trunk_reader_options();
  const unsigned deepest = std::max(t.queue_depth, t.max_depth);
  s += fmt::format(
      "  trunk reads: {} chunks, {}{} in flight{}, landing in the ring slots and pinned layers\n",
      human_bytes(double(t.chunk_bytes)), t.queue_depth,
      deepest > t.queue_depth ? fmt::format("-{} (adaptive)", deepest) : "",
      t.gated_depth ? fmt::format(", {} while an expert read the layer waits for is out", t.gated_depth)
                    : "");
  if (p.expert_slot_bytes) {
    const io::UringReader::Options e = expert_reader_options(p.expert_slot_bytes, p.max_seqs);
    s += fmt::format("  expert reads: {}{} x {} chunks in flight, landing in the expert slots\n",
                     e.queue_depth,
                     e.max_depth > e.queue_depth ? fmt::format("-{} (adaptive)", e.max_depth) : "",
                     human_bytes(double(e.chunk_bytes)));
  }
  return s;
}

std::string plan_json(const MemoryPlan& p) {
  io::JsonWriter w;
  w.begin_object()
      .field("budget", p.budget)
      .field("source", p.request.source)
      .field("floor", p.floor)
      .field("total", p.total())
      .field("unassigned", p.unassigned())
      .key("pools")
      .begin_array();
  for (const PlanTerm& t : p.pools)
    w.begin_object()
        .field("name", t.name)
        .field("count", t.count)
        .field("each", t.each)
        .field("bytes", t.bytes)
        .end_object();
  w.end_array()
      .key("trunk")
      .begin_object()
      .field("ring_slots", p.ring_slots)
      .field("slot_read_bytes", p.slot_read_bytes)
      .field("slot_widen_bytes", p.slot_widen_bytes)
      .field("spanning_layer", p.spanning_layer)
      .field("span_slots", p.span_slots)
      .field("pinned", p.pinned)
      .field("trunk_bytes", p.trunk_bytes)
      .field("streamed_bytes", p.streamed_bytes)
      .field("streamed_stored_bytes", p.streamed_stored_bytes)
      .field("codec", p.codec.empty() ? std::string("none") : p.codec)
      .field("decode_slots", p.decode_slots)
      .field("decode_slot_bytes", p.decode_slot_bytes + p.decode_widen_bytes)
      .end_object()
      .key("experts")
      .begin_object()
      .field("slot_bytes", p.expert_slot_bytes)
      .field("inflight", p.inflight_slots)
      .field("lookahead", p.lookahead_slots)
      .field("cache", p.cache_slots)
      .end_object()
      .key("sequences")
      .begin_object()
      .field("max_seqs", p.max_seqs)
      .field("context", p.context)
      .field("pass_rows", p.pass_rows)
      .field("state_bytes_per_sequence", p.seq_kda_bytes + p.seq_kv_bytes)
      .field("kda_bytes_per_sequence", p.seq_kda_bytes)
      .field("kv_bytes_per_sequence", p.seq_kv_bytes)
      .end_object()
      .end_object();
  return w.str();
}

}  // namespace k3::pipeline
