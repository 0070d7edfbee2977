// Reads for the streaming graph (graph_impl.hpp): a layer's trunk read into its
// ring slot or pin region, a batch of expert reads into claimed slots (sorted by file offset, each
// slot's read tracked until its last chunk lands), the ring schedule, and the trace counters.
#include <algorithm>
#include <chrono>
#include <thread>
#include <utility>

#include "pipeline/graph/graph_impl.hpp"

namespace k3::pipeline {

void StreamingModel::Impl::counters() {
  if (!Trace::enabled()) return;
  const int64_t ring = accounting.ring_in_use.load();
  const int64_t experts = cache ? int64_t(cache->occupied()) : 0;
  Trace::counter("trunk ring slots in use", ring);
  Trace::counter("expert slots in use", experts);
  // The trunk reader's depth as it adapts to the device (reader_options.cpp, io::DepthTuner).
  Trace::counter("trunk reader depth", int64_t(trunk_reader.counters().depth));
  if (trunk.compressed()) Trace::counter("trunk decode slots in use", int64_t(decode.slots_in_use.load()));
  Trace::counter("resident weight bytes",
                 ring * int64_t(trunk.slot_read_bytes()) +
                     int64_t(decode.slots_in_use.load()) * int64_t(trunk.decode_slot_bytes()) +
                     int64_t(trunk.pinned_bytes()) + experts * int64_t(cache ? cache->slot_bytes() : 0));
}

// ------------------------------------------------------------------ trunk reads

void StreamingModel::Impl::submit_trunk(Visit visit, SlotRef slot_ref, TrunkReadNode::gateway_type& gw) {
  const int layer = visit.layer, slot = slot_ref.index;
  const LayerSource& ls = src.layer(layer);
  std::span<std::byte> bytes = trunk.read_target(layer, slot);  // compressed: its stored bytes
  TrunkSlots::Holder& h = trunk.read_holder(layer, slot);
  h.pending_reads.store(int(ls.reads.size()));
  h.read_failed.store(false);
  trunk_reqs.clear();
  for (const Extent& e : ls.reads)
    trunk_reqs.push_back(io::ReadRequest{e.file, e.offset, bytes.subspan(e.dst_offset, e.bytes), 0});
  const uint64_t id = ++accounting.read_ids;
  const uint64_t total = ls.read_bytes;
  if (slot >= 0) accounting.ring_in_use += trunk.parts(layer);
  const uint64_t seq = decode.read_seq++;  // trunk_read is serial: its submission order
  counters();
  accounting.activity.read_begin(total, false);
  accounting.stats[kTrunkRead]->bytes.fetch_add(total, std::memory_order_relaxed);
  if (Trace::enabled()) {
    TraceArgs a = args(layer, -1, slot);
    a.bytes = int64_t(total);
    a.offset = int64_t(ls.reads.front().offset);
    Trace::async_begin("trunk read", "io", id, a, accounting.trunk_track.tid());
  }
  // The graph waits for this read: wait_for_all() cannot return while it is in flight. If the
  // submission itself throws, nothing will complete, so the wait is given back here.
  gw.reserve_wait();
  try {
    trunk_reader.submit(trunk_reqs,
                        [this, &gw, &h, visit, slot_ref, id, total, seq](const io::ReadCompletion& r) {
                          if (!r.ok()) {
                            h.read_failed.store(true);
                            fail(r.message);
                          }
                          if (h.pending_reads.fetch_sub(1) == 1) {
                            if (read_delay_ms > 0)  // test hook: the layer lands that much later
                              std::this_thread::sleep_for(std::chrono::milliseconds(read_delay_ms));
                            if (Trace::enabled())
                              Trace::async_end("trunk read", "io", id, accounting.trunk_track.tid());
                            accounting.activity.read_end(total);
                            if (!h.read_failed.load())
                              gw.try_put(TrunkReady{.visit = visit, .slot = slot_ref, .seq = seq});
                            gw.release_wait();
                          }
                        });
  } catch (...) {
    accounting.activity.read_end(total);
    gw.release_wait();
    throw;
  }
}

void StreamingModel::Impl::schedule_ring(int call_index) {
  for (int l = 0; l < n_layers; ++l)
    if (!trunk.pinned(l)) {
      const Visit v{uint64_t(call_index), l};
      const int parts = trunk.parts(l);
      for (int p = 0; p < parts; ++p) node<kSchedule>().try_put(TrunkJob{v, p});
    }
  ring_scheduled_through = call_index;
}

// ------------------------------------------------------------------ experts

void StreamingModel::Impl::submit_experts(const ReadBatch& b, ExpertReadNode::gateway_type& gw) {
  expert_reqs.clear();
  for (const ReadItem& it : b.items) {
    src.expert(it.layer, it.expert, expert_read);
    const ExpertRead& er = expert_read;
    SlotRead& sr = slot_reads[size_t(it.slot)];
    sr.layout = er.layout;
    sr.bind_offset = er.bind_offset;
    sr.bytes = er.read_bytes;
    sr.visit = it.visit;
    sr.layer = it.layer;
    sr.expert = it.expert;
    sr.pending.store(int(er.reads.size()));
    sr.failed.store(false);
    sr.trace_id = ++accounting.read_ids;
    sr.trace_name = it.prefetch ? "expert prefetch" : "expert read";
    std::span<std::byte> dst = cache->bytes(it.slot);
    for (const Extent& e : er.reads)
      expert_reqs.push_back(
          io::ReadRequest{e.file, e.offset, dst.subspan(e.dst_offset, e.bytes), uint64_t(it.slot),
                          /*urgent=*/!it.prefetch});  // the layer waits for it: ahead of prefetches
    if (it.prefetch) ++accounting.counts.predicted;
    accounting.activity.read_begin(er.read_bytes, true);
    accounting.stats[kExpertRead]->bytes.fetch_add(er.read_bytes, std::memory_order_relaxed);
    if (Trace::enabled()) {
      TraceArgs a = args(it.layer, it.expert, it.slot);
      a.bytes = int64_t(er.read_bytes);
      a.offset = int64_t(er.first_offset);
      Trace::async_begin(sr.trace_name, "io", sr.trace_id, a, accounting.expert_track.tid());
    }
    gw.reserve_wait();
  }
  counters();
  io::sort_by_position(expert_reqs);  // the batch in file order, whatever order the layer asked in
  try {
    expert_reader.submit(expert_reqs, [this, &gw](const io::ReadCompletion& r) {
      const int slot = int(r.tag);
      SlotRead& sr = slot_reads[size_t(slot)];
      if (!r.ok()) {
        sr.failed.store(true);
        fail(r.message);
      }
      if (sr.pending.fetch_sub(1) == 1) {
        if (read_delay_ms > 0)  // test hook: the expert lands that much later
          std::this_thread::sleep_for(std::chrono::milliseconds(read_delay_ms));
        if (Trace::enabled())
          Trace::async_end(sr.trace_name, "io", sr.trace_id, accounting.expert_track.tid());
        accounting.activity.read_end(sr.bytes);
        gw.try_put(ExpertLanded{sr.visit, slot, -1, true, !sr.failed.load()});
        gw.release_wait();
      }
    });
  } catch (...) {  // nothing was queued: give back every wait taken above
    for (const ReadItem& it : b.items) {
      accounting.activity.read_end(slot_reads[size_t(it.slot)].bytes);
      gw.release_wait();
    }
    throw;
  }
}

}  // namespace k3::pipeline
