// The streaming graph's node bodies (graph.hpp has the diagram, graph_wiring.hpp the edges), one
// member function per node that runs code, in the diagram's order: trunk, layer, MoE, head. A body
// reads the step it works for from its message's visit (Impl::step) and names the port it sends on.
#include <fmt/format.h>

#include <algorithm>
#include <utility>
#include <variant>

#include "io/error.hpp"
#include "io/layer_decode.hpp"
#include "io/packed_trunk.hpp"
#include "pipeline/graph/graph_impl.hpp"
#include "stages/attnres.hpp"
#include "stages/head.hpp"
#include "stages/layer.hpp"
#include "stages/moe.hpp"

namespace k3::pipeline {

// ------------------------------------------------------------------ trunk

void StreamingModel::Impl::trunk_read_body(const TrunkClaim& in, TrunkReadNode::gateway_type& gw) {
  const TrunkJob& job = std::get<size_t(ClaimIn::job)>(in);
  SlotRef slot = std::get<size_t(ClaimIn::slot)>(in);
  run_node(kTrunkRead, false, args(job.visit.layer, -1, slot.index), [&] {
    if (!slot.pinned() && trunk.parts(job.visit.layer) > 1) {  // takes the whole ring
      span_held.push_back(slot);
      if (int(span_held.size()) < trunk.ring_slots()) return;
      span_held.clear();
      slot = SlotRef{0};
    }
    submit_trunk(job.visit, slot, gw);
  });
}

// Compressed trunk: decodes the stored layer in its ring slot(s) into the decoded slot it was paired
// with (a pinned layer: into its pin region, once, and the decoded slot goes straight back), blocks
// split over the arena by a parallel_for, then gives the layer to trunk_bind. Block checks are
// verified on a layer's first decode in this process -- the raw trunk's policy for its xxh64
// (check_loaded), which trunk_bind still applies to the decoded bytes -- and skipped afterwards
// (docs/codec.md, "The decode stage": what verifying always would cost).
// Fused decode (exp4 or exp3, a streamed layer): trunk_bind binds the projections coded over the stored
// bytes, so the ring slot(s) stay with the layer until layer_done, and only the blocks not wholly
// inside the coded ranges (known from the layout before the first read: stages::coded_ranges) are
// decoded into the decoded slot -- the matvecs decode the rest, tile by tile; the first pass hashes
// the whole layer as it streams past. Otherwise the ring slot(s) go back right after the decode.
void StreamingModel::Impl::trunk_decode_body(const DecodeClaim& in, Outputs<kTrunkDecode>& out) {
  const TrunkReady& r = std::get<size_t(DecodeClaimIn::stored)>(in);
  const DecodeSlot d = std::get<size_t(DecodeClaimIn::slot)>(in);
  const int l = r.visit.layer;
  const bool pin = trunk.pinned(l);
  const bool fuse = decode.fused && !pin;
  const SlotRef to = pin ? SlotRef::pin() : SlotRef{d.index};
  bool done = false;
  run_node(kTrunkDecode, true, args(l, -1, to.index), [&] {
    const bool verify = !decode.decoded_once[size_t(l)];
    const io::codec::Stream st = src.trunk()->layer_stream(l, trunk.read_target(l, r.slot.index));
    const std::span<std::byte> dst = trunk.bytes(l, to.index).first(size_t(st.raw_bytes()));
    if (fuse && st.block_values() != io::codec::default_block_values(st.codec()))
      throw io::runtime_error(fmt::format(
          "trunk: layer {}: its stream has blocks of {} values, the plan's decoded slot assumed {} "
          "(re-run pack-trunk)",
          l, st.block_values(), io::codec::default_block_values(st.codec())));
    // A fused layer's first pass returns the whole layer's xxh64, checked as check_loaded would.
    if (const std::optional<uint64_t> digest = io::decode_layer(
            st, dst, fuse ? &decode.fused_ranges[size_t(l)] : nullptr, verify, decode.scratch))
      src.trunk()->check_loaded_digest(l, *digest);
    decode.decoded_once[size_t(l)] = 1;
    if (fuse) decode.slot_stream[size_t(d.index)].emplace(st);
    // the layer's decoded bytes, here or (fused) inside this pass's matvecs
    accounting.stats[kTrunkDecode]->bytes.fetch_add(st.raw_bytes(), std::memory_order_relaxed);
    done = true;
  });
  if (!done) return;  // the run has failed: the driver reports it
  const int k = trunk.parts(l);
  if (fuse) {
    decode.slot_ring[size_t(d.index)] = r.slot.index;  // held until layer_done
  } else {
    accounting.ring_in_use -= k;
    for (int s = 0; s < k; ++s) port<DecodeOut::free_ring>(out).try_put(k == 1 ? r.slot : SlotRef{s});
  }
  if (!pin) ++decode.slots_in_use;
  counters();
  if (pin) port<DecodeOut::free_decoded>(out).try_put(d);
  port<DecodeOut::ready>(out).try_put(TrunkReady{.visit = r.visit, .slot = to, .seq = r.seq});
}

void StreamingModel::Impl::trunk_bind_body(const TrunkReady& m, Outputs<kTrunkBind>& out) {
  const int l = m.visit.layer, s = m.slot.index;
  bool done = false;
  run_node(kTrunkBind, true, args(l, -1, s), [&] {
    const LayerSource& ls = src.layer(l);
    TrunkSlots::Holder& h = trunk.holder(l, s);
    // A packed trunk's layer is checked against trunk.json's xxh64 the first time it lands.
    if (const io::PackedTrunk* pt = src.trunk()) pt->check_loaded(l, trunk.bytes(l, s));
    std::span<const std::byte> bytes = trunk.bytes(l, s).subspan(ls.bind_offset, ls.layout.buffer_bytes);
    stages::CodedLayer coded;
    const bool learn =
        decode.fused && !m.slot.pinned() && !decode.fused_known[size_t(l)].load(std::memory_order_acquire);
    if (decode.fused && !m.slot.pinned()) {  // fused decode: the projections decode from the stored bytes
      coded.src = &*decode.slot_stream[size_t(s)];
      coded.first_byte = ls.bind_offset;
      if (learn) coded.coded = &decode.fused_ranges[size_t(l)];
    }
    h.w = stages::bind_layer(cfg, l, ls.layout, bytes, trunk.widen(l, s), coded);
    if (learn) {
      std::sort(decode.fused_ranges[size_t(l)].begin(), decode.fused_ranges[size_t(l)].end());
      decode.fused_known[size_t(l)].store(true, std::memory_order_release);
    }
    h.visit.store(key(m.visit), std::memory_order_release);
    if (m.slot.pinned()) {
      trunk.set_pin_loaded(l);
      accounting.pin_loaded_bytes += trunk.bytes(l, -1).size();
    }
    done = true;
  });
  if (done) port<TrunkBindOut::ready>(out).try_put(m);  // after the span (see router_body)
}

// ------------------------------------------------------------------ layer

void StreamingModel::Impl::attention_body(const GatedLayer& in, Outputs<kAttention>& out) {
  const TrunkReady& r = std::get<size_t(LayerGateIn::ready)>(in);
  StepState& S = step(r.visit);
  const int l = r.visit.layer;
  bool done = false;
  run_node(kAttention, true, args_rows(S.T, l, -1, r.slot.index), [&] {
    S.cur = StepState::Current{l, r.slot, &trunk.holder(l, r.slot.index).w};
    S.layer_segs = stages::layer_segments(S.segs, l);
    stages::layer_attention(*S.cur.w, cfg, S.buf.P, S.T, *S.buf.B, S.layer_segs, S.buf.x, S.buf.attn_sc);
    done = true;
  });
  if (!done) return;  // the run has failed: the driver reports it
  // After the span (see router_body): what follows may start reads before this thread closes it.
  if (std::holds_alternative<stages::MoeWeights>(S.cur.w->ffn))
    port<AttentionOut::moe>(out).try_put(RouteGo{r.visit});
  else
    port<AttentionOut::dense>(out).try_put(DenseGo{r.visit});
}

void StreamingModel::Impl::dense_ffn_body(const DenseGo& m, Outputs<kDenseFfn>& out) {
  StepState& S = step(m.visit);
  bool done = false;
  run_node(kDenseFfn, true, args_rows(S.T, S.cur.layer), [&] {
    stages::dense_ffn(std::get<stages::DenseFfnWeights>(S.cur.w->ffn), cfg, S.buf.x, S.T, S.buf.a,
                      S.buf.dense_sc);
    stages::layer_ffn_add(S.buf.P, S.buf.a.first(S.T * hidden));
    S.after_layer(S.cur.layer, S.buf.P, hidden);
    done = true;
  });
  if (done) port<DenseOut::done>(out).try_put(LayerDone{m.visit});  // after the span: see layer_done
}

// ------------------------------------------------------------------ MoE

void StreamingModel::Impl::router_body(const RouteGo& m, Outputs<kRouter>& out) {
  StepState& S = step(m.visit);
  const bool ser = strategy == Strategy::serial, la = lookahead_graph();
  bool done = false;
  run_node(kRouter, true, args_rows(S.T, S.cur.layer), [&] {
    const auto& mw = std::get<stages::MoeWeights>(S.cur.w->ffn);
    const size_t T = S.T;
    stages::route(mw, cfg, S.buf.x, T, std::span(S.buf.idx).first(T * top_k), S.buf.weight.first(T * top_k),
                  S.buf.route_sc);
    if (replay) replay->apply(S.cur.layer, replay_fed, std::span(S.buf.idx).first(T * top_k), int(top_k));
    if (routing) routing->layer(S.cur.layer, std::span<const int32_t>(S.buf.idx).first(T * top_k));
    // The pieces combine waits for: every expert group, the shared experts (and the lookahead).
    S.moe.begin(m.visit, std::span<const int32_t>(S.buf.idx).first(T * top_k), cfg, 1 + (la ? 1 : 0),
                exchange);
    done = true;
  });
  if (!done) return;  // the run has failed: the driver reports it
  // After the span, as every node's puts: with two threads the shared experts (and under serial
  // the fetch and reads that follow them) can run before this thread closes a span it is still in.
  // Fetch last: a thread runs the task it spawned last first, so the reads are submitted before this
  // thread starts the shared experts (with one thread, the only order that overlaps them). trunk
  // starts the shared experts with the first landed wave -- or now, on a rank that owns none of the
  // layer's chosen experts (no wave will land).
  if (strategy == Strategy::overlap || la || ser || S.moe.unique() == 0)
    port<RouterOut::shared>(out).try_put(SharedGo{m.visit});
  if (!ser) port<RouterOut::fetch>(out).try_put(FetchGo{m.visit});
}

void StreamingModel::Impl::expert_fetch_body(const FetchGo& m, Outputs<kExpertFetch>& out) {
  MoeLayerRun& moe = step(m.visit).moe;
  run_node(kExpertFetch, false, args(moe.layer()), [&] {
    ReadBatch batch;
    hit_groups.clear();
    const MoeLayerRun::Claim claim = moe.claim(m.visit, *cache, accounting.counts, hit_groups, batch);
    if (claim.stale) return;  // a retry for a layer already done
    for (int gi : hit_groups)
      port<FetchOut::hits>(out).try_put(ExpertLanded{m.visit, moe.slot(size_t(gi)), gi, false, true});
    if (claim.first && lookahead_graph()) port<FetchOut::lookahead>(out).try_put(LookaheadGo{m.visit});
    if (!batch.items.empty()) port<FetchOut::misses>(out).try_put(batch);  // last: runs first
  });
}

void StreamingModel::Impl::expert_read_body(const ReadBatch& b, ExpertReadNode::gateway_type& gw) {
  run_node(kExpertRead, false, args(b.items.empty() ? -1 : b.items[0].layer), [&] { submit_experts(b, gw); });
}

int StreamingModel::Impl::bind_landed(int slot) {
  SlotRead& sr = slot_reads[size_t(slot)];
  std::span<const std::byte> bytes = cache->bytes(slot).subspan(sr.bind_offset, sr.layout->buffer_bytes);
  cache->weights(slot) = stages::bind_expert(cfg, *sr.layout, bytes, cache->widen(slot));
  return cache->landed(slot, true);
}

// serial: a landed read is only noted, and its wave is bound when the wave's last expert lands, so
// nothing computes while one of the wave's reads is in flight (MoeLayerRun::completes_wave).
void StreamingModel::Impl::expert_landed_body(const ExpertLanded& m, Outputs<kExpertLanded>& out) {
  MoeLayerRun& moe = step(m.visit).moe;
  const bool ser = strategy == Strategy::serial;
  const bool binds = ser ? moe.completes_wave() : m.read;
  std::optional<Visit> shared_go;
  bool done = false;  // the body ran to its end (not a failed read, a prefetch, or a throw)
  go_out.clear();
  run_node(kExpertLanded, binds, args(moe.layer(), -1, m.slot), [&] {
    int gi = m.group;
    const bool defer = ser && m.read;
    if (m.read) {
      if (!m.ok) {
        cache->landed(m.slot, false);
        return;
      }
      if (!defer) {
        gi = bind_landed(m.slot);
        if (gi < 0) {  // a prefetch landed: one more evictable slot for a layer waiting on slots
          moe.if_waiting_for_slots([&](Visit v) { port<LandedOut::retry>(out).try_put(FetchGo{v}); });
          return;
        }
      }
    }
    const MoeLayerRun::Landed landed = moe.landed(
        defer ? -1 : gi, defer ? m.slot : -1, [this](int slot) { return bind_landed(slot); }, go_out);
    if (landed.start_shared) shared_go = landed.visit;
    done = true;
  });
  if (!done) return;
  // After the span (the node runs one body at a time, so go_out is still this call's): a put can run
  // the expert's compute -- and under serial the next wave's reads -- on another thread before this
  // one closes its span, and the binding span would then seem to compute while those reads are out.
  for (const ExpertGo& x : go_out) port<LandedOut::go>(out).try_put(x);
  if (shared_go) port<LandedOut::shared>(out).try_put(SharedGo{*shared_go});
}

void StreamingModel::Impl::shared_body(const SharedGo& m, Outputs<kShared>& out) {
  StepState& S = step(m.visit);
  bool fetch = false, last_piece = false, done = false;
  run_node(kShared, true, args_rows(S.T, S.cur.layer), [&] {
    const auto& mw = std::get<stages::MoeWeights>(S.cur.w->ffn);
    const size_t T = S.T;
    stages::moe_latent(mw, S.buf.x, T, S.buf.z);
    for (size_t i = 0; i < S.moe.unique(); ++i)
      port<SharedOut::latent>(out).try_put(LatentGo{m.visit, int(i)});
    stages::shared_experts(mw, cfg, S.buf.x, T, S.buf.shared, S.buf.shared_sc);
    fetch = strategy == Strategy::serial;  // serial: experts are read only now
    last_piece = S.moe.piece_done();
    done = true;
  });
  // After the span, as the read follows it (and the last piece, the next layer's trunk read).
  if (done && last_piece) port<SharedOut::last_piece>(out).try_put(PieceDone{m.visit});
  if (fetch) port<SharedOut::fetch>(out).try_put(FetchGo{m.visit});
}

void StreamingModel::Impl::expert_compute_body(const GatedExpert& in, Outputs<kExpertCompute>& out) {
  const ExpertGo& x = std::get<size_t(ExpertJoinIn::expert)>(in);
  StepState& S = step(x.visit);
  const size_t gi = size_t(x.group);
  bool retry = false;
  run_node(
      kExpertCompute, true, args_rows(S.moe.rows(gi).size(), S.moe.layer(), S.moe.expert(gi), x.slot), [&] {
        std::span<const uint32_t> rows = S.moe.rows(gi);
        std::span<float> sc =
            S.buf.apply_sc.subspan(S.moe.apply_offset(gi), stages::expert_apply_scratch(cfg, rows.size()));
        stages::expert_apply(cache->weights(x.slot), cfg, S.buf.z, rows, S.buf.eout, sc);
        cache->release(x.slot);
        retry = S.moe.computed();
        if (S.moe.piece_done()) port<ComputeOut::last_piece>(out).try_put(PieceDone{x.visit});
      });
  if (retry)
    port<ComputeOut::retry>(out).try_put(FetchGo{x.visit});  // after the span, as the read follows it
}

void StreamingModel::Impl::lookahead_body(const LookaheadGo& m, Outputs<kLookahead>& out) {
  StepState& S = step(m.visit);
  const int next = m.visit.layer + 1;
  run_node(kLookahead, true, args(next), [&] {
    ReadBatch batch;
    const bool starving = S.moe.starving();  // this layer still waits for slots
    const TrunkSlots::Holder* h = next < n_layers ? trunk.find_bound(next, key(m.visit.next())) : nullptr;
    if (!starving && h && std::holds_alternative<stages::MoeWeights>(h->w.ffn) && plan.lookahead_slots > 0 &&
        prefetch_on.load(std::memory_order_relaxed)) {
      const size_t T = S.T;
      std::span<int32_t> idx = std::span(S.buf.la_idx).first(T * top_k);
      stages::route(std::get<stages::MoeWeights>(h->w.ffn), cfg, S.buf.x, T, idx,
                    S.buf.la_weight.first(T * top_k), S.buf.la_route_sc);
      predicted_experts.assign(idx.begin(), idx.end());
      std::sort(predicted_experts.begin(), predicted_experts.end());
      predicted_experts.erase(std::unique(predicted_experts.begin(), predicted_experts.end()),
                              predicted_experts.end());
      for (int e : predicted_experts) {
        if (exchange && !exchange->owns(e)) continue;  // another rank's to read
        if (batch.items.size() >= plan.lookahead_slots) break;
        const ExpertCache::Result r = cache->prefetch(next, e);
        if (r.found == ExpertCache::Found::full) break;
        if (r.found == ExpertCache::Found::claimed)
          batch.items.push_back(ReadItem{m.visit, r.slot, next, e, true});
      }
    }
    if (!batch.items.empty()) port<LookaheadOut::prefetch>(out).try_put(batch);
  });
  if (S.moe.piece_done()) port<LookaheadOut::last_piece>(out).try_put(PieceDone{m.visit});
}

// One rank of several: its experts' rows out, every other rank's in (one allgatherv, RankExperts),
// so eout holds every slot's bytes as in one process before combine sums them in top-k order. Every
// rank reaches it once per MoE layer, owning some of the layer's experts or none.
void StreamingModel::Impl::exchange_body(const PieceDone& m, Outputs<kExchange>& out) {
  StepState& S = step(m.visit);
  bool done = false;
  run_node(kExchange, false, args(S.cur.layer), [&] {
    exchange->exchange(S.moe.all_groups(), cfg, S.buf.eout);
    done = true;
  });
  if (done) port<ExchangeOut::done>(out).try_put(m);
}

void StreamingModel::Impl::combine_body(const PieceDone& m, Outputs<kCombine>& out) {
  StepState& S = step(m.visit);
  bool done = false;
  run_node(kCombine, true, args_rows(S.T, S.cur.layer), [&] {
    const size_t T = S.T;
    stages::moe_combine(std::get<stages::MoeWeights>(S.cur.w->ffn), cfg, S.buf.weight.first(T * top_k),
                        S.buf.eout, S.buf.shared, T, S.buf.a, S.buf.combine_sc);
    stages::layer_ffn_add(S.buf.P, S.buf.a.first(T * hidden));
    S.after_layer(S.cur.layer, S.buf.P, hidden);
    done = true;
  });
  if (done) port<CombineOut::done>(out).try_put(LayerDone{m.visit});  // after the span: see layer_done
}

// ------------------------------------------------------------------ the layer is done

// Its ring slot goes back to the free list, the next layer may run. (serial reads the next layer
// from here, so dense_ffn and combine send LayerDone only after their compute span has closed: one
// read or one compute at a time, to the microsecond.)
void StreamingModel::Impl::layer_done_body(const LayerDone& m, Outputs<kLayerDone>& out) {
  StepState& S = step(m.visit);
  const StepState::Current& cur = S.cur;
  run_node(kLayerDone, false, args(cur.layer, -1, cur.slot.index), [&] {
    const int l = cur.layer;
    if (!cur.slot.pinned()) {
      trunk.holder(l, cur.slot.index).visit.store(kNoVisit, std::memory_order_release);
      if (trunk.compressed()) {  // its decoded slot, and (fused decode) the ring slot(s) it held
        const int ring = std::exchange(decode.slot_ring[size_t(cur.slot.index)], -1);
        if (ring >= 0) {
          const int k = trunk.parts(l);
          accounting.ring_in_use -= k;
          for (int s = 0; s < k; ++s)
            port<LayerDoneOut::free_slot>(out).try_put(k == 1 ? SlotRef{ring} : SlotRef{s});
        }
        --decode.slots_in_use;
        port<LayerDoneOut::free_decoded>(out).try_put(DecodeSlot{cur.slot.index});
      } else {
        const int k = trunk.parts(l);
        accounting.ring_in_use -= k;
        for (int s = 0; s < k; ++s)
          port<LayerDoneOut::free_slot>(out).try_put(k == 1 ? cur.slot : SlotRef{s});
      }
      counters();
    }
    for (const stages::Segment& s : S.segs)
      if (s.state->watch.on_layer)
        s.state->watch.on_layer(l + 1, n_layers, accounting.pin_loaded_bytes.load(),
                                accounting.pin_total_bytes);
    if (l + 1 < n_layers) {
      if (strategy == Strategy::serial)
        request_layer(
            m.visit.next(), [&](const TrunkJob& j) { port<LayerDoneOut::schedule>(out).try_put(j); },
            [&](const TrunkClaim& cl) { port<LayerDoneOut::claim_pin>(out).try_put(cl); },
            [&](const TrunkReady& r) { port<LayerDoneOut::pin_ready>(out).try_put(r); });
      port<LayerDoneOut::next_layer>(out).try_put(LayerGo{m.visit.next()});
    } else {
      port<LayerDoneOut::head>(out).try_put(HeadGo{m.visit});
    }
  });
}

void StreamingModel::Impl::head_body(const HeadGo& m) {
  StepState& S = step(m.visit);
  run_node(kHead, true, args_rows(S.T, -1), [&] {
    const stages::HeadWeights& hw = head->w;
    const size_t n_out = S.head_all ? S.T : S.segs.size();
    if (S.head_all) {  // every row, as stages::forward's HeadAt::all
      stages::attnres_stage(*S.buf.B, S.buf.P, hw.out_res_norm, hw.out_res_proj, cfg, 0, S.T, S.buf.h,
                            S.buf.agg_sc);
    } else {
      for (size_t i = 0; i < n_out; ++i) {  // each segment's last row (AttnRes is per token)
        const size_t t = S.segs[i].first_row + S.segs[i].rows - 1;
        stages::attnres_stage(*S.buf.B, S.buf.P, hw.out_res_norm, hw.out_res_proj, cfg, t, t + 1,
                              S.buf.h.subspan(i * hidden, hidden), S.buf.agg_sc);
      }
    }
    stages::lm_head(hw, cfg, S.buf.h, n_out, S.logits, S.buf.head_sc);
  });
  call_gate.end();  // the logits are written: the driver may sample while reads for the next call run on
}

}  // namespace k3::pipeline
