// The streaming graph declared in one place (build(): its nodes, in the order of the diagram in
// graph.hpp, then its edges), each call's activation buffers, and the public face. The state it
// builds on is in graph_impl.hpp; the reads its async nodes submit are in graph_io.cpp.
#include "pipeline/graph.hpp"

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
#include <vector>

#include "io/error.hpp"
#include "io/packed_trunk.hpp"
#include "pipeline/graph_impl.hpp"
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
  throw io::usage_error(
      fmt::format("--strategy: unknown strategy '{}' (known: serial, trunk, overlap, lookahead, auto)", name));
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

// The graph, declared in one place: nodes in the order of the diagram in graph.hpp, then edges.
void StreamingModel::Impl::build() {
  own_stats = std::make_unique<NodeStats[]>(kNodeCount);
  const bool ser = strategy == Strategy::serial,
             la = strategy == Strategy::lookahead || strategy == Strategy::automatic;
  const bool waves = strategy == Strategy::serial || strategy == Strategy::trunk;
  constexpr size_t unlimited = flow::unlimited, serial = flow::serial;

  // ---- trunk: schedule + free slots -> claim -> read -> bind ----
  stats[kSchedule] = &describe(kSchedule, "queue_node", 0, "trunk io");
  schedule = std::make_unique<flow::queue_node<TrunkJob>>(g);
  stats[kTrunkFree] = &describe(kTrunkFree, "queue_node (free list)", 0, "trunk io");
  trunk_free = std::make_unique<flow::queue_node<int>>(g);
  stats[kTrunkClaim] = &describe(kTrunkClaim, "join_node queueing", 0, "trunk io");
  trunk_claim = std::make_unique<flow::join_node<TrunkClaim, flow::queueing>>(g);

  stats[kTrunkRead] = &describe(kTrunkRead, "async_node (io_uring)", 1, "trunk io");
  trunk_read = std::make_unique<TrunkReadNode>(
      g, serial, [this](const TrunkClaim& in, TrunkReadNode::gateway_type& gw) {
        const TrunkJob& job = std::get<0>(in);
        int slot = std::get<1>(in);
        run_node(kTrunkRead, false, args(job.layer, -1, slot), [&] {
          if (slot >= 0 && job.layer == trunk.spanning_layer()) {  // takes the whole ring
            span_held.push_back(slot);
            if (int(span_held.size()) < trunk.ring_slots()) return;
            span_held.clear();
            slot = 0;
          }
          submit_trunk(job.visit, job.layer, slot, gw);
        });
      });

  stats[kTrunkBind] = &describe(kTrunkBind, "multifunction_node", 0, "trunk io");
  trunk_bind = std::make_unique<flow::multifunction_node<TrunkReady, std::tuple<TrunkReady>>>(
      g, unlimited, [this](const TrunkReady& m, auto& out) {
        run_node(kTrunkBind, true, args(m.layer, -1, m.slot), [&] {
          const LayerSource& ls = src.layer(m.layer);
          TrunkSlots::Holder& h = trunk.holder(m.layer, m.slot);
          // A packed trunk's layer is checked against trunk.json's xxh64 the first time it lands.
          if (const io::PackedTrunk* pt = src.trunk())
            pt->check_loaded(m.layer, trunk.bytes(m.layer, m.slot));
          std::span<const std::byte> bytes =
              trunk.bytes(m.layer, m.slot).subspan(ls.bind_offset, ls.layout.buffer_bytes);
          h.w = stages::bind_layer(c, m.layer, ls.layout, bytes, trunk.widen(m.layer, m.slot));
          h.visit.store(m.visit, std::memory_order_release);
          if (m.slot < 0) {
            trunk.set_pin_loaded(m.layer);
            pin_loaded_bytes += trunk.bytes(m.layer, -1).size();
          }
          std::get<0>(out).try_put(m);
        });
      });

  // ---- a layer runs when its weights and the previous layer's output are both there ----
  stats[kLayerGate] = &describe(kLayerGate, "join_node key_matching (visit)", 0, "layer");
  layer_gate =
      std::make_unique<flow::join_node<std::tuple<LayerGo, TrunkReady>, flow::key_matching<uint64_t>>>(
          g, [](const LayerGo& m) { return m.visit; }, [](const TrunkReady& m) { return m.visit; });

  stats[kAttention] = &describe(kAttention, "multifunction_node", 1, "layer");
  attention = std::make_unique<
      flow::multifunction_node<std::tuple<LayerGo, TrunkReady>, std::tuple<LayerMsg, LayerMsg>>>(
      g, serial, [this](const std::tuple<LayerGo, TrunkReady>& in, auto& out) {
        const TrunkReady& r = std::get<1>(in);
        run_node(kAttention, true, args(r.layer, -1, r.slot), [&] {
          cur = Current{r.visit, r.layer, r.slot, &trunk.holder(r.layer, r.slot).w};
          stages::layer_attention(*cur.w, c, call.P, call.T, *call.B, call.st->layer(r.layer), call.x,
                                  call.attn_sc);
          if (std::holds_alternative<stages::MoeWeights>(cur.w->ffn))
            std::get<0>(out).try_put(LayerMsg{r.visit});
          else
            std::get<1>(out).try_put(LayerMsg{r.visit});
        });
      });

  stats[kDenseFfn] = &describe(kDenseFfn, "multifunction_node", 1, "layer");
  dense_ffn = std::make_unique<flow::multifunction_node<LayerMsg, std::tuple<LayerDone>>>(
      g, serial, [this](const LayerMsg& m, auto& out) {
        bool done = false;
        run_node(kDenseFfn, true, args(cur.layer), [&] {
          stages::dense_ffn(std::get<stages::DenseFfnWeights>(cur.w->ffn), c, call.x, call.T, call.a,
                            call.dense_sc);
          stages::layer_ffn_add(call.P, call.a.first(call.T * E));
          call.st->watch.after_layer(cur.layer, call.P.first(call.T * E), E, call.st->cached);
          done = true;
        });
        if (done) std::get<0>(out).try_put(LayerDone{m.visit});  // after the span: see kLayerDone
      });

  // ---- MoE: route, fetch (cache, reads), land, latent + shared, experts, combine ----
  stats[kRouter] = &describe(kRouter, "multifunction_node", 1, "moe");
  router = std::make_unique<flow::multifunction_node<LayerMsg, std::tuple<FetchMsg, LayerMsg>>>(
      g, serial, [this, ser, la](const LayerMsg& m, auto& out) {
        run_node(kRouter, true, args(cur.layer), [&] {
          const auto& mw = std::get<stages::MoeWeights>(cur.w->ffn);
          const size_t T = call.T;
          stages::route(mw, c, call.x, T, std::span(call.idx).first(T * K), call.weight.first(T * K),
                        call.route_sc);
          {
            std::lock_guard lk(moe.mu);
            moe.visit = m.visit;
            moe.layer = cur.layer;
            stages::group_by_expert(std::span<const int32_t>(call.idx).first(T * K), moe.groups);
            const size_t U = moe.unique();
            moe.slot.assign(U, -1);
            moe.apply_off.resize(U);
            size_t off = 0;
            for (size_t i = 0; i < U; ++i) {
              moe.apply_off[i] = off;
              off += stages::expert_apply_scratch(c, moe.groups.rows_of(i).size());
            }
            moe.next_pending = moe.wave_pending = 0;
            moe.held.clear();
            moe.unbound.clear();
            moe.computing = 0;
            moe.shared_started = moe.fetched = false;
            moe.remaining.store(int(U) + 1 + (la ? 1 : 0));
          }
          // Fetch last: a thread runs the task it spawned last first, so the reads are submitted
          // before this thread starts the shared experts (with one thread, the only order that
          // overlaps them).
          if (strategy == Strategy::overlap || la || ser) std::get<1>(out).try_put(LayerMsg{m.visit});
          if (!ser) std::get<0>(out).try_put(FetchMsg{m.visit});
        });
      });

  stats[kExpertFetch] = &describe(kExpertFetch, "multifunction_node", 1, "moe");
  expert_fetch =
      std::make_unique<flow::multifunction_node<FetchMsg, std::tuple<ReadBatch, ExpertLanded, LayerMsg>>>(
          g, serial, [this, la](const FetchMsg& m, auto& out) {
            run_node(kExpertFetch, false, args(moe.layer), [&] {
              ReadBatch batch;
              hit_groups.clear();
              bool first = false;
              {
                std::lock_guard lk(moe.mu);
                if (m.visit != moe.visit) return;  // a stale retry
                first = !moe.fetched;
                moe.fetched = true;
                while (moe.next_pending < moe.unique()) {
                  const int gi = int(moe.next_pending);
                  const int e = moe.groups.experts[size_t(gi)];
                  const ExpertCache::Result r = cache->request(moe.layer, e, gi);
                  if (r.found == ExpertCache::Found::full) break;  // retried when a slot frees
                  ++requests;
                  if (r.found != ExpertCache::Found::claimed) ++hits;
                  if (r.was_prefetch) ++used;
                  moe.slot[size_t(gi)] = r.slot;
                  ++moe.next_pending;
                  ++moe.wave_pending;
                  if (r.found == ExpertCache::Found::ready) hit_groups.push_back(gi);
                  if (r.found == ExpertCache::Found::claimed)
                    batch.items.push_back(ReadItem{r.slot, moe.layer, e, false});
                }
              }
              for (int gi : hit_groups)
                std::get<1>(out).try_put(ExpertLanded{moe.slot[size_t(gi)], gi, false, true});
              if (first && la) std::get<2>(out).try_put(LayerMsg{m.visit});
              if (!batch.items.empty()) std::get<0>(out).try_put(std::move(batch));  // last: runs first
            });
          });

  stats[kExpertRead] = &describe(kExpertRead, "async_node (io_uring)", 1, "moe");
  expert_read = std::make_unique<ExpertReadNode>(
      g, serial, [this](const ReadBatch& b, ExpertReadNode::gateway_type& gw) {
        run_node(kExpertRead, false, args(b.items.empty() ? -1 : b.items[0].layer),
                 [&] { submit_experts(b, gw); });
      });

  // Binds a landed read's expert weights; returns its group (< 0: a prefetch).
  auto bind_landed = [this](int slot) {
    SlotRead& sr = slot_reads[size_t(slot)];
    std::span<const std::byte> bytes = cache->bytes(slot).subspan(sr.bind_offset, sr.layout->buffer_bytes);
    cache->weights(slot) = stages::bind_expert(c, *sr.layout, bytes, cache->widen(slot));
    return cache->landed(slot, true);
  };
  // serial: a landed read is only noted, and its wave is bound when the wave's last expert lands, so
  // nothing computes while one of the wave's reads is in flight. Whether this message completes the
  // wave is known on entry: a wave's claims are all counted before its first read or hit is sent, and
  // the next wave is claimed only once this one is computed.
  stats[kExpertLanded] = &describe(kExpertLanded, "multifunction_node", 1, "moe");
  expert_landed =
      std::make_unique<flow::multifunction_node<ExpertLanded, std::tuple<ExpertGo, LayerMsg, FetchMsg>>>(
          g, serial, [this, waves, ser, bind_landed](const ExpertLanded& m, auto& out) {
            bool binds = m.read;
            if (ser) {
              std::lock_guard lk(moe.mu);
              binds = moe.wave_pending == 1;
            }
            run_node(kExpertLanded, binds, args(moe.layer, -1, m.slot), [&] {
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
                    std::lock_guard lk(moe.mu);
                    if (moe.next_pending < moe.unique()) std::get<2>(out).try_put(FetchMsg{moe.visit});
                    return;
                  }
                }
              }
              go_out.clear();
              bool start_shared = false;
              uint64_t v;
              {
                std::lock_guard lk(moe.mu);
                v = moe.visit;
                if (!waves) {
                  go_out.push_back(ExpertGo{group_key(v, gi), gi, moe.slot[size_t(gi)]});
                } else {
                  if (defer)
                    moe.unbound.push_back(m.slot);
                  else
                    moe.held.push_back(gi);
                  if (--moe.wave_pending == 0) {  // the whole wave has landed
                    for (int slot : moe.unbound) moe.held.push_back(bind_landed(slot));
                    moe.unbound.clear();
                    for (int h : moe.held)
                      go_out.push_back(ExpertGo{group_key(v, h), h, moe.slot[size_t(h)]});
                    moe.held.clear();
                    start_shared = strategy == Strategy::trunk && !moe.shared_started;
                    moe.shared_started = true;
                  }
                }
                moe.computing += go_out.size();
              }
              for (const ExpertGo& x : go_out) std::get<0>(out).try_put(x);
              if (start_shared) std::get<1>(out).try_put(LayerMsg{v});
            });
          });

  stats[kShared] = &describe(kShared, "multifunction_node", 1, "moe");
  shared = std::make_unique<flow::multifunction_node<LayerMsg, std::tuple<LatentGo, FetchMsg, LayerMsg>>>(
      g, serial, [this, ser](const LayerMsg& m, auto& out) {
        bool fetch = false;
        run_node(kShared, true, args(cur.layer), [&] {
          const auto& mw = std::get<stages::MoeWeights>(cur.w->ffn);
          const size_t T = call.T;
          stages::moe_latent(mw, call.x, T, call.z);
          for (size_t i = 0; i < moe.unique(); ++i)
            std::get<0>(out).try_put(LatentGo{group_key(m.visit, int(i))});
          stages::shared_experts(mw, c, call.x, T, call.shared, call.shared_sc);
          fetch = ser;  // serial: experts are read only now
          if (--moe.remaining == 0) std::get<2>(out).try_put(LayerMsg{m.visit});
        });
        if (fetch) std::get<1>(out).try_put(FetchMsg{m.visit});  // after the span, as the read follows it
      });

  stats[kExpertJoin] = &describe(kExpertJoin, "join_node key_matching (visit, expert)", 0, "moe");
  expert_join =
      std::make_unique<flow::join_node<std::tuple<ExpertGo, LatentGo>, flow::key_matching<uint64_t>>>(
          g, [](const ExpertGo& m) { return m.key; }, [](const LatentGo& m) { return m.key; });

  stats[kExpertCompute] = &describe(kExpertCompute, "multifunction_node", 0, "moe");
  expert_compute = std::make_unique<
      flow::multifunction_node<std::tuple<ExpertGo, LatentGo>, std::tuple<FetchMsg, LayerMsg>>>(
      g, unlimited, [this, ser](const std::tuple<ExpertGo, LatentGo>& in, auto& out) {
        const ExpertGo& x = std::get<0>(in);
        const uint64_t v = x.key >> 16;
        const size_t gi = size_t(x.group);
        bool retry = false;
        run_node(kExpertCompute, true, args(moe.layer, moe.groups.experts[gi], x.slot), [&] {
          std::span<const uint32_t> rows = moe.groups.rows_of(gi);
          std::span<float> sc =
              call.apply_sc.subspan(moe.apply_off[gi], stages::expert_apply_scratch(c, rows.size()));
          stages::expert_apply(cache->weights(x.slot), c, call.z, rows, call.eout, sc);
          cache->release(x.slot);
          {
            std::lock_guard lk(moe.mu);
            const bool wave_computed = --moe.computing == 0;
            // serial: the next wave is read once this one is computed, not as its first slot frees
            retry = moe.next_pending < moe.unique() && (!ser || wave_computed);
          }
          if (--moe.remaining == 0) std::get<1>(out).try_put(LayerMsg{v});
        });
        if (retry) std::get<0>(out).try_put(FetchMsg{v});  // after the span, as the read follows it
      });

  stats[kLookahead] = &describe(kLookahead, "multifunction_node", 1, "moe");
  lookahead = std::make_unique<flow::multifunction_node<LayerMsg, std::tuple<ReadBatch, LayerMsg>>>(
      g, serial, [this](const LayerMsg& m, auto& out) {
        const int next = layer_of(m.visit) + 1;
        run_node(kLookahead, true, args(next), [&] {
          ReadBatch batch;
          bool starving;
          {
            std::lock_guard lk(moe.mu);
            starving = moe.next_pending < moe.unique();  // this layer still waits for slots
          }
          const TrunkSlots::Holder* h = next < n ? trunk.find_bound(next, m.visit + 1) : nullptr;
          if (!starving && h && std::holds_alternative<stages::MoeWeights>(h->w.ffn) &&
              plan.lookahead_slots > 0 && prefetch_on.load(std::memory_order_relaxed)) {
            const size_t T = call.T;
            std::span<int32_t> idx = std::span(call.la_idx).first(T * K);
            stages::route(std::get<stages::MoeWeights>(h->w.ffn), c, call.x, T, idx,
                          call.la_weight.first(T * K), call.la_route_sc);
            predicted_experts.assign(idx.begin(), idx.end());
            std::sort(predicted_experts.begin(), predicted_experts.end());
            predicted_experts.erase(std::unique(predicted_experts.begin(), predicted_experts.end()),
                                    predicted_experts.end());
            for (int e : predicted_experts) {
              if (batch.items.size() >= plan.lookahead_slots) break;
              const ExpertCache::Result r = cache->prefetch(next, e);
              if (r.found == ExpertCache::Found::full) break;
              if (r.found == ExpertCache::Found::claimed)
                batch.items.push_back(ReadItem{r.slot, next, e, true});
            }
          }
          if (!batch.items.empty()) std::get<0>(out).try_put(std::move(batch));
        });
        if (--moe.remaining == 0) std::get<1>(out).try_put(LayerMsg{m.visit});
      });

  stats[kCombine] = &describe(kCombine, "multifunction_node", 1, "moe");
  combine = std::make_unique<flow::multifunction_node<LayerMsg, std::tuple<LayerDone>>>(
      g, serial, [this](const LayerMsg& m, auto& out) {
        bool done = false;
        run_node(kCombine, true, args(cur.layer), [&] {
          const size_t T = call.T;
          stages::moe_combine(std::get<stages::MoeWeights>(cur.w->ffn), c, call.weight.first(T * K),
                              call.eout, call.shared, T, call.a, call.combine_sc);
          stages::layer_ffn_add(call.P, call.a.first(T * E));
          call.st->watch.after_layer(cur.layer, call.P.first(T * E), E, call.st->cached);
          done = true;
        });
        if (done) std::get<0>(out).try_put(LayerDone{m.visit});  // after the span: see kLayerDone
      });

  // ---- the layer is done: its ring slot goes back to the free list, the next layer may run ----
  // (serial reads the next layer from here, so dense_ffn and combine send LayerDone only after their
  // compute span has closed: one read or one compute at a time, to the microsecond.)
  stats[kLayerDone] = &describe(kLayerDone, "multifunction_node", 1, "layer");
  layer_done = std::make_unique<flow::multifunction_node<
      LayerDone, std::tuple<int, LayerGo, HeadMsg, TrunkJob, TrunkClaim, TrunkReady>>>(
      g, serial, [this, ser](const LayerDone& m, auto& out) {
        run_node(kLayerDone, false, args(cur.layer, -1, cur.slot), [&] {
          const int l = cur.layer;
          if (cur.slot >= 0) {
            trunk.holder(l, cur.slot).visit.store(kNoVisit, std::memory_order_release);
            const int k = l == trunk.spanning_layer() ? trunk.ring_slots() : 1;
            ring_in_use -= k;
            for (int s = 0; s < k; ++s) std::get<0>(out).try_put(k == 1 ? cur.slot : s);
            counters();
          }
          if (call.st->watch.on_layer)
            call.st->watch.on_layer(l + 1, n, pin_loaded_bytes.load(), pin_total_bytes);
          if (l + 1 < n) {
            if (ser)
              request_layer(
                  m.visit + 1, [&](const TrunkJob& j) { std::get<3>(out).try_put(j); },
                  [&](const TrunkClaim& cl) { std::get<4>(out).try_put(cl); },
                  [&](const TrunkReady& r) { std::get<5>(out).try_put(r); });
            std::get<1>(out).try_put(LayerGo{m.visit + 1});
          } else {
            std::get<2>(out).try_put(HeadMsg{m.visit});
          }
        });
      });

  stats[kHead] = &describe(kHead, "function_node", 1, "layer");
  head_node = std::make_unique<flow::function_node<HeadMsg>>(g, serial, [this](const HeadMsg&) {
    run_node(kHead, true, args(-1), [&] {
      const size_t T = call.T;
      const stages::HeadWeights& hw = head->w;
      stages::attnres_stage(*call.B, call.P, hw.out_res_norm, hw.out_res_proj, c, T - 1, T, call.h,
                            call.agg_sc);
      stages::lm_head(hw, c, call.h, 1, call.logits, call.head_sc);
    });
    end_call();  // the logits are written: the driver may sample while reads for the next call run on
    return flow::continue_msg();
  });

  // ---- edges ----
  using flow::input_port;
  using flow::make_edge;
  using flow::output_port;
  make_edge(*schedule, input_port<0>(*trunk_claim));
  make_edge(*trunk_free, input_port<1>(*trunk_claim));
  make_edge(*trunk_claim, *trunk_read);
  make_edge(*trunk_read, *trunk_bind);
  make_edge(output_port<0>(*trunk_bind), input_port<1>(*layer_gate));
  make_edge(*layer_gate, *attention);
  make_edge(output_port<0>(*attention), *router);
  make_edge(output_port<1>(*attention), *dense_ffn);
  make_edge(output_port<0>(*dense_ffn), *layer_done);
  make_edge(output_port<0>(*router), *expert_fetch);
  make_edge(output_port<1>(*router), *shared);
  make_edge(output_port<0>(*expert_fetch), *expert_read);
  make_edge(output_port<1>(*expert_fetch), *expert_landed);
  make_edge(output_port<2>(*expert_fetch), *lookahead);
  make_edge(*expert_read, *expert_landed);
  make_edge(output_port<0>(*expert_landed), input_port<0>(*expert_join));
  make_edge(output_port<1>(*expert_landed), *shared);
  make_edge(output_port<2>(*expert_landed), *expert_fetch);
  make_edge(output_port<0>(*shared), input_port<1>(*expert_join));
  make_edge(output_port<1>(*shared), *expert_fetch);
  make_edge(output_port<2>(*shared), *combine);
  make_edge(*expert_join, *expert_compute);
  make_edge(output_port<0>(*expert_compute), *expert_fetch);
  make_edge(output_port<1>(*expert_compute), *combine);
  make_edge(output_port<0>(*lookahead), *expert_read);
  make_edge(output_port<1>(*lookahead), *combine);
  make_edge(output_port<0>(*combine), *layer_done);
  make_edge(output_port<0>(*layer_done), *trunk_free);
  make_edge(output_port<1>(*layer_done), input_port<0>(*layer_gate));
  make_edge(output_port<2>(*layer_done), *head_node);
  make_edge(output_port<3>(*layer_done), *schedule);
  make_edge(output_port<4>(*layer_done), *trunk_read);
  make_edge(output_port<5>(*layer_done), input_port<1>(*layer_gate));

  if (!dot) return;
  dot->add_pool("trunk ring", "trunk io", uint64_t(trunk.ring_slots()), trunk.slot_read_bytes());
  dot->add_pool("pinned trunk", "trunk io", plan.pinned.size(),
                plan.pinned.empty() ? 0 : trunk.pinned_bytes() / plan.pinned.size());
  if (cache) {
    dot->add_pool("expert slots", "moe", cache->slot_count(), cache->slot_bytes());
    dot->add_edge("expert slots", kNodeNames[kExpertFetch], "claim (LRU, pins)");
  }
  auto e = [&](Node a, Node b, const char* label = "") {
    dot->add_edge(kNodeNames[a], kNodeNames[b], label);
  };
  e(kSchedule, kTrunkClaim, "job");
  e(kTrunkFree, kTrunkClaim, "free slot");
  dot->add_edge("trunk ring", kNodeNames[kTrunkFree], "slot ids");
  dot->add_edge("pinned trunk", kNodeNames[kTrunkRead], "first touch");
  e(kTrunkClaim, kTrunkRead, "(job, slot)");
  e(kTrunkRead, kTrunkBind, "landed");
  e(kTrunkBind, kLayerGate, "weights ready");
  e(kLayerGate, kAttention, "visit");
  e(kAttention, kRouter, "moe");
  e(kAttention, kDenseFfn, "dense");
  e(kDenseFfn, kLayerDone);
  if (!ser) e(kRouter, kExpertFetch, "route");
  if (strategy != Strategy::trunk) e(kRouter, kShared);
  e(kExpertFetch, kExpertRead, "misses, by offset");
  e(kExpertFetch, kExpertLanded, "hits");
  if (la) e(kExpertFetch, kLookahead);
  e(kExpertRead, kExpertLanded, "landed");
  e(kExpertLanded, kExpertJoin, waves ? "wave landed" : "expert landed");
  if (strategy == Strategy::trunk) e(kExpertLanded, kShared, "first wave");
  e(kExpertLanded, kExpertFetch, "retry");
  e(kShared, kExpertJoin, "latent ready");
  if (ser) e(kShared, kExpertFetch, "then read");
  e(kShared, kCombine, "last piece");
  e(kExpertJoin, kExpertCompute);
  e(kExpertCompute, kExpertFetch, "retry (slot freed)");
  e(kExpertCompute, kCombine, "last piece");
  if (la) {
    e(kLookahead, kExpertRead, "prefetch");
    e(kLookahead, kCombine, "last piece");
  }
  e(kCombine, kLayerDone);
  e(kLayerDone, kTrunkFree, "slot released");
  e(kLayerDone, kLayerGate, "next visit");
  e(kLayerDone, kHead, "last layer");
  if (ser) e(kLayerDone, kSchedule, "next read");
}

void StreamingModel::Impl::prepare_call(stages::DecodeState& st, size_t T, std::span<float> logits) {
  const size_t maxb = size_t(c.max_blocks()), cap = st.capacity();
  const bool moe_model = src.has_experts();
  const size_t rows = T * K;
  const size_t sizes[] = {
      T * E,                                                         // P
      maxb * T * E,                                                  // blocks
      T * E,                                                         // x
      T * E,                                                         // a
      stages::layer_attention_scratch(c, T, cap > T ? cap - T : 0),  // attention
      stages::dense_scratch(c, T),                                   // dense FFN
      E,                                                             // h (head)
      E,                                                             // head scratch
      stages::attnres_scratch(c, maxb),                              // model-level AttnRes
      moe_model ? stages::route_scratch(c) : 0,                      // route
      moe_model ? rows : 0,                                          // weight
      moe_model ? T * L : 0,                                         // z
      moe_model ? rows * L : 0,                                      // expert outputs
      moe_model ? T * E : 0,                                         // shared
      moe_model ? stages::shared_scratch(c, T) : 0,                  // shared scratch
      moe_model ? stages::expert_apply_scratch(c, rows) : 0,         // per-expert scratch, disjoint
      moe_model ? stages::combine_scratch(c, T) : 0,                 // combine
      moe_model ? stages::route_scratch(c) : 0,                      // lookahead route
      moe_model ? rows : 0,                                          // lookahead weight
  };
  size_t total = 0;
  for (size_t s : sizes) total += s;
  if (call.mem.size() < total) call.mem.resize(total);
  stages::Carver cut(call.mem);
  std::span<float>* dst[] = {&call.P,          &call.blocks,      &call.x,         &call.a,
                             &call.attn_sc,    &call.dense_sc,    &call.h,         &call.head_sc,
                             &call.agg_sc,     &call.route_sc,    &call.weight,    &call.z,
                             &call.eout,       &call.shared,      &call.shared_sc, &call.apply_sc,
                             &call.combine_sc, &call.la_route_sc, &call.la_weight};
  for (size_t i = 0; i < std::size(sizes); ++i) *dst[i] = cut.take(sizes[i]);
  if (call.idx.size() < rows) {
    call.idx.resize(rows);
    call.la_idx.resize(rows);
  }
  call.st = &st;
  call.T = T;
  call.logits = logits;
  call.B.emplace(call.blocks, maxb, T, E);
}

// ------------------------------------------------------------------ the public face

StreamingModel::StreamingModel(const WeightSources& s, const Plan& p, Strategy st, GraphDescription* dot)
    : impl_(std::make_unique<Impl>(s, p, st, dot)) {}

StreamingModel::~StreamingModel() = default;

void StreamingModel::expect_calls(int n) {
  impl_->expected_calls = std::max(n, 1);
}

void StreamingModel::forward(stages::DecodeState& st, std::span<const int32_t> ids, std::span<float> logits) {
  Impl& m = *impl_;
  const io::ModelConfig& c = m.c;
  const size_t T = ids.size(), V = size_t(c.vocab);
  stages::check_forward_inputs(c, st, ids);
  if (m.failed.load()) throw io::runtime_error(m.fail_msg);
  if (m.calls_done.load() > 0 && m.step_delay_ms > 0)  // test hook: time to change files between tokens
    std::this_thread::sleep_for(std::chrono::milliseconds(m.step_delay_ms));

  // Reads for this call may have landed (and their bind nodes run) since the last call returned;
  // nothing but this call's nodes touches the activations prepared here.
  if (!m.open_call()) throw io::runtime_error(m.fail_msg);
  m.act.step_begin();
  m.prepare_call(st, T, logits.first(V));
  {
    m.act.compute_begin();
    TraceSpan span(m.embed_track, "embed", "compute", m.args(-1));
    stages::embed_tokens(m.head->w, c, ids, m.call.P);
    st.watch.after_layer(stages::ForwardWatch::kEmbedding, m.call.P.first(T * m.E), m.E, st.cached);
    m.act.compute_end();
  }
  const int k = m.calls_done.load();
  const uint64_t v0 = uint64_t(k) * uint64_t(m.n);
  auto job = [&](const TrunkJob& j) { m.schedule->try_put(j); };
  auto claim = [&](const TrunkClaim& cl) { m.trunk_read->try_put(cl); };
  auto ready = [&](const TrunkReady& r) { flow::input_port<1>(*m.layer_gate).try_put(r); };
  if (m.strategy == Strategy::serial) {
    m.request_layer(v0, job, claim, ready);
  } else {
    for (int l = 0; l < m.n; ++l)
      if (m.trunk.pinned(l)) m.request_layer(v0 + uint64_t(l), job, claim, ready);
    if (m.ring_scheduled_through < k) m.schedule_ring(k);
    if (k + 1 < m.expected_calls && m.ring_scheduled_through < k + 1) m.schedule_ring(k + 1);
  }
  flow::input_port<0>(*m.layer_gate).try_put(LayerGo{v0});
  m.wait_call();
  m.last = m.act.step_end();
  if (m.tuner) {  // strategy auto: the next call prefetches or not, from what the steps cost
    m.tuner->after_call(m.last.wall_seconds, T);
    m.prefetch_on.store(m.tuner->prefetch(), std::memory_order_relaxed);
  }
  if (m.failed.load()) {
    m.g.wait_for_all();  // every node has skipped its body or finished; reads have completed
    throw io::runtime_error(m.fail_msg);
  }
  st.cached += T;
  ++m.calls_done;
}

const StepStats& StreamingModel::last_step() const {
  return impl_->last;
}

StreamTotals StreamingModel::totals() const {
  Impl& m = *impl_;
  StreamTotals t;
  t.trunk_bytes_read = m.act.trunk_bytes();
  t.expert_bytes_read = m.act.expert_bytes();
  t.expert_requests = m.requests.load();
  t.expert_hits = m.hits.load();
  t.lookahead_predicted = m.predicted.load();
  t.lookahead_used = m.used.load();
  const io::ReaderCounters a = m.trunk_reader.counters(), b = m.expert_reader.counters();
  t.uring_bytes = a.uring_bytes + b.uring_bytes;
  t.pread_bytes = a.pread_bytes + b.pread_bytes;
  t.direct_bytes = a.direct_bytes + b.direct_bytes;
  t.io_busy_seconds = m.act.io_busy_seconds();
  t.compute_busy_seconds = m.act.compute_busy_seconds();
  t.uring = m.trunk_reader.backend() == io::UringReader::Backend::uring &&
            m.expert_reader.backend() == io::UringReader::Backend::uring;
  if (m.tuner) t.automatic = m.tuner->describe();
  return t;
}

uint64_t StreamingModel::allocated_bytes() const {
  const Impl& m = *impl_;
  return m.head->bytes.size() + 4 * m.head->widen.size() + m.trunk.ring_bytes() + m.trunk.pinned_bytes() +
         (m.cache ? m.cache->arena_bytes() : 0);
}

}  // namespace k3::pipeline
