#include "pipeline/bench/device_probe.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <numeric>

#include "io/aligned.hpp"
#include "io/error.hpp"
#include "io/packed_trunk.hpp"
#include "io/safetensors.hpp"
#include "pipeline/support/clock.hpp"
#include "pipeline/support/human_bytes.hpp"
#include "stages/tensors.hpp"

namespace k3::pipeline {

namespace {

using io::align_down;
using io::align_up;
using io::kDirectAlign;

// The ceiling's destination area unless asked otherwise (CeilingOptions::dest_bytes).
constexpr uint64_t kDefaultDestBytes = uint64_t{256} << 20;

// [begin, end) of a shard widened to the enclosing 4096 window; the last window stops at EOF.
ProbeRange window(const io::ShardSet& shards, uint32_t shard, uint64_t begin, uint64_t end) {
  const uint64_t size = shards.shard_size(shard);
  const uint64_t b = align_down(begin, kDirectAlign);
  const uint64_t e = std::min<uint64_t>(align_up(end, kDirectAlign), size);
  return {&shards.shard_file(shard), b, e - b};
}

// Byte runs of one shard: adjacent ranges (a gap under one page) merge, as one read would fetch them.
std::vector<ProbeRange> runs(const io::ShardSet& shards, std::vector<io::TensorInfo> parts) {
  std::sort(parts.begin(), parts.end(), [](const io::TensorInfo& a, const io::TensorInfo& b) {
    return std::pair(a.shard, a.offset) < std::pair(b.shard, b.offset);
  });
  std::vector<ProbeRange> out;
  size_t i = 0;
  while (i < parts.size()) {
    const uint32_t shard = parts[i].shard;
    const uint64_t begin = parts[i].offset;
    uint64_t end = begin + parts[i].nbytes;
    size_t j = i + 1;
    while (j < parts.size() && parts[j].shard == shard && parts[j].offset < end + kDirectAlign) {
      end = std::max(end, parts[j].offset + parts[j].nbytes);
      ++j;
    }
    out.push_back(window(shards, shard, begin, end));
    i = j;
  }
  return out;
}

uint64_t splitmix64(uint64_t& s) {
  uint64_t z = (s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// A fixed set of equal, 4096-aligned destination slots; acquire() blocks until one is free.
class SlotPool {
 public:
  SlotPool(size_t count, uint64_t slot_bytes)
      : stride_(align_up(std::max<uint64_t>(slot_bytes, 1), kDirectAlign)), buffer_(count * stride_) {
    for (size_t i = 0; i < count; ++i) free_.push_back(count - 1 - i);
  }
  size_t acquire() {
    std::unique_lock lock(m_);
    cv_.wait(lock, [&] { return !free_.empty(); });
    const size_t i = free_.back();
    free_.pop_back();
    return i;
  }
  void release(size_t i) {
    {
      std::lock_guard lock(m_);
      free_.push_back(i);
    }
    cv_.notify_one();
  }
  std::span<std::byte> slot(size_t i, uint64_t bytes) { return {buffer_.data() + i * stride_, bytes}; }

 private:
  uint64_t stride_;
  io::AlignedBuffer buffer_;
  std::mutex m_;
  std::condition_variable cv_;
  std::vector<size_t> free_;
};

struct Progress {
  std::mutex m;
  uint64_t bytes = 0, requests = 0;
  std::string error;
  void done(const io::ReadCompletion& c) {
    std::lock_guard lock(m);
    if (c.ok()) {
      bytes += c.dst.size();
      ++requests;
    } else if (error.empty()) {
      error = c.message.empty() ? fmt::format("read failed: errno {}", c.error) : c.message;
    }
  }
  uint64_t completed() {
    std::lock_guard lock(m);
    return bytes;
  }
};

enum Reads : unsigned { kTrunk = 1, kExperts = 2 };

// One reader for trunk reads and one for experts, as the engine's graph has (each with its own ring
// and queue depth).
struct Readers {
  io::UringReader trunk, experts;
  Readers(const io::UringReader::Options& t, const io::UringReader::Options& e) : trunk(t), experts(e) {}
  uint64_t direct_bytes() const { return trunk.counters().direct_bytes + experts.counters().direct_bytes; }
};

PhaseResult run_phase(Readers& readers, const ProbePattern& p, unsigned reads, double seconds, uint64_t& rng,
                      SlotPool& trunk_pool, SlotPool& expert_pool) {
  PhaseResult r;
  Progress prog;
  const uint64_t direct0 = readers.direct_bytes();
  const double t0 = now_seconds();
  double t_pass = t0;
  uint64_t bytes_pass = 0;
  std::vector<int> ids;
  std::vector<std::pair<ProbeRange, SlotPool*>> batch;
  std::vector<io::ReadRequest> reqs;
  std::vector<size_t> slots;
  bool stop = false;
  while (!stop) {
    size_t l = 0;
    for (; l < p.layers.size() && !stop; ++l) {
      const ProbeLayer& layer = p.layers[l];
      batch.clear();
      if (reads & kTrunk)
        for (const ProbeRange& t : layer.trunk) batch.emplace_back(t, &trunk_pool);
      if ((reads & kExperts) && !layer.experts.empty()) {
        // top_k distinct experts (partial Fisher-Yates); submitted in file order below, as the
        // engine's expert reads are.
        ids.resize(layer.experts.size());
        std::iota(ids.begin(), ids.end(), 0);
        const size_t k = std::min<size_t>(size_t(p.top_k), ids.size());
        for (size_t i = 0; i < k; ++i) std::swap(ids[i], ids[i + splitmix64(rng) % (ids.size() - i)]);
        std::vector<ProbeRange> picked;
        for (size_t i = 0; i < k; ++i) picked.push_back(layer.experts[size_t(ids[i])]);
        for (const ProbeRange& e : picked) batch.emplace_back(e, &expert_pool);
      }
      // Trunk reads go one by one (each waits for a ring slot); the expert batch is submitted
      // under one wake-up once it holds its slots.
      reqs.clear();
      slots.clear();
      for (auto& [range, pool] : batch) {
        const size_t s = pool->acquire();
        const io::ReadRequest req{range.file, range.offset, pool->slot(s, range.bytes),
                                  (uint64_t(s) << 1) | (pool == &expert_pool ? 1u : 0u)};
        if (pool == &trunk_pool) {
          readers.trunk.submit(req, [&prog, &trunk_pool, s](const io::ReadCompletion& c) {
            prog.done(c);
            trunk_pool.release(s);
          });
        } else {
          reqs.push_back(req);
        }
      }
      io::sort_by_position(reqs);
      if (!reqs.empty())
        readers.experts.submit(reqs, [&prog, &expert_pool](const io::ReadCompletion& c) {
          prog.done(c);
          expert_pool.release(size_t(c.tag >> 1));
        });
      if (now_seconds() - t0 >= seconds) stop = true;
    }
    if (l == p.layers.size()) {
      // A whole token submitted: bytes landed since the last boundary over the time since it.
      const double t = now_seconds();
      const uint64_t b = prog.completed();
      if (t > t_pass && b > bytes_pass) r.pass_gbps.push_back(double(b - bytes_pass) / (t - t_pass) / 1e9);
      t_pass = t;
      bytes_pass = b;
      ++r.passes;
    }
  }
  readers.trunk.wait_idle();
  readers.experts.wait_idle();
  r.seconds = now_seconds() - t0;
  r.bytes = prog.bytes;
  r.requests = prog.requests;
  r.direct_bytes = readers.direct_bytes() - direct0;
  if (!prog.error.empty()) throw io::runtime_error("device probe: " + prog.error);
  return r;
}

std::string phase_line(const char* what, const PhaseResult& r) {
  if (r.bytes == 0) return fmt::format("  {:<34} -\n", what);
  std::string s = fmt::format("  {:<34} {:7.3f} GB/s  ({} in {:.2f} s, {} requests", what, r.gbps(),
                              human_bytes(double(r.bytes)), r.seconds, r.requests);
  if (r.pass_gbps.size() >= 2) {
    std::vector<double> v = r.pass_gbps;
    std::sort(v.begin(), v.end());
    s += fmt::format(", {} tokens: {:.3f}..{:.3f} GB/s", v.size(), v.front(), v.back());
  }
  return s + ")\n";
}

}  // namespace

uint64_t ProbePattern::largest_trunk_read() const {
  uint64_t m = 0;
  for (const ProbeLayer& l : layers)
    for (const ProbeRange& r : l.trunk) m = std::max(m, r.bytes);
  return m;
}

uint64_t ProbePattern::largest_expert_read() const {
  uint64_t m = 0;
  for (const ProbeLayer& l : layers)
    for (const ProbeRange& r : l.experts) m = std::max(m, r.bytes);
  return m;
}

uint64_t ProbePattern::token_bytes_estimate() const {
  uint64_t total = 0;
  for (const ProbeLayer& l : layers) {
    for (const ProbeRange& r : l.trunk) total += r.bytes;
    if (l.experts.empty()) continue;
    uint64_t sum = 0;
    for (const ProbeRange& r : l.experts) sum += r.bytes;
    total += sum / l.experts.size() * uint64_t(std::min<size_t>(size_t(top_k), l.experts.size()));
  }
  return total;
}

ProbePattern probe_pattern(const io::ModelConfig& config, const io::ShardSet& shards,
                           const io::PackedTrunk* trunk) {
  ProbePattern p;
  p.source = trunk ? "trunk.bin" : "shards";
  p.top_k = config.top_k;
  p.layers.resize(size_t(config.n_layers));
  if (trunk) {
    p.files.push_back(&trunk->file());
    for (int l = 0; l < config.n_layers; ++l) {
      const io::TrunkLayer& t = trunk->layer(l);
      p.layers[size_t(l)].trunk.push_back({&trunk->file(), t.file_off, t.nbytes});
    }
  } else {
    for (uint32_t s = 0; s < shards.shard_count(); ++s) p.files.push_back(&shards.shard_file(s));
    const io::TrunkLayout lay = io::layout_trunk(shards, config.n_layers);
    for (int l = 0; l < config.n_layers; ++l)
      p.layers[size_t(l)].trunk = runs(shards, lay.sources[size_t(l)]);
  }
  if (config.n_experts > 0 && config.top_k > 0) {
    for (int l = 0; l < config.n_layers; ++l) {
      if (config.is_dense(l)) continue;
      std::vector<ProbeRange>& ex = p.layers[size_t(l)].experts;
      ex.reserve(size_t(config.n_experts));
      for (int e = 0; e < config.n_experts; ++e) {
        const stages::Layout lay = stages::locate_expert(shards, config, l, e);
        if (lay.contiguous) {
          ex.push_back(window(shards, lay.shard, lay.run_begin, lay.run_end));
          continue;
        }
        // Scattered tensors: the span of the expert's bytes in its (first) shard stands for it.
        std::vector<io::TensorInfo> parts;
        for (const stages::Placement& pl : lay.places) parts.push_back(pl.info);
        std::vector<ProbeRange> r = runs(shards, parts);
        ProbeRange span = r.front();
        for (const ProbeRange& x : r)
          if (x.file == span.file) {
            const uint64_t end = std::max(span.offset + span.bytes, x.offset + x.bytes);
            span.offset = std::min(span.offset, x.offset);
            span.bytes = end - span.offset;
          }
        ex.push_back(span);
      }
    }
  }
  return p;
}

ProbeResult probe_device(const ProbePattern& p, const ProbeOptions& o) {
  ProbeResult r;
  Readers readers(o.trunk_reader, o.expert_reader);
  r.backend = io::backend_name(readers.trunk.backend());
  r.fallback_reason = readers.trunk.fallback_reason();
  r.trunk_queue_depth = readers.trunk.options().queue_depth;
  r.trunk_max_depth = readers.trunk.options().max_depth;
  r.trunk_chunk_bytes = readers.trunk.options().chunk_bytes;
  r.expert_queue_depth = readers.experts.options().queue_depth;
  r.expert_chunk_bytes = readers.experts.options().chunk_bytes;

  size_t trunk_per_layer = 1;
  for (const ProbeLayer& l : p.layers) trunk_per_layer = std::max(trunk_per_layer, l.trunk.size());
  SlotPool trunk_pool(2 * trunk_per_layer, p.largest_trunk_read());
  SlotPool expert_pool(size_t(2 * std::max(p.top_k, 1)), p.largest_expert_read());
  uint64_t rng = o.seed;
  const bool has_experts = p.largest_expert_read() > 0;
  r.mixed = run_phase(readers, p, kTrunk | kExperts, o.seconds / 2, rng, trunk_pool, expert_pool);
  r.trunk = run_phase(readers, p, kTrunk, o.seconds / 4, rng, trunk_pool, expert_pool);
  if (has_experts) r.experts = run_phase(readers, p, kExperts, o.seconds / 4, rng, trunk_pool, expert_pool);
  return r;
}

std::string format_probe(const ProbePattern& p, const ProbeResult& r) {
  const uint64_t all = r.mixed.bytes + r.trunk.bytes + r.experts.bytes;
  const uint64_t direct = r.mixed.direct_bytes + r.trunk.direct_bytes + r.experts.direct_bytes;
  const double direct_pct = all ? 100.0 * double(direct) / double(all) : 0.0;
  std::string s = fmt::format(
      "device probe: {} readers as the engine opens them (trunk: queue depth {}{} x {} KiB chunks, "
      "experts: {} x {} KiB), O_DIRECT {:.1f}% of bytes, reading {}\n",
      r.backend, r.trunk_queue_depth,
      r.trunk_max_depth > r.trunk_queue_depth ? fmt::format(" (adaptive up to {})", r.trunk_max_depth) : "",
      r.trunk_chunk_bytes >> 10, r.expert_queue_depth, r.expert_chunk_bytes >> 10, direct_pct, p.source);
  if (!r.fallback_reason.empty()) s += fmt::format("  (pread fallback: {})\n", r.fallback_reason);
  if (direct_pct < 99.0)
    s += "  NOTE: part of the reads were buffered (filesystem refused O_DIRECT, or unaligned edges): the "
         "page cache may flatter the figure\n";
  if (r.mixed.passes >= 3)
    s += fmt::format(
        "  NOTE: one token's reads ({}) were replayed {} times: a cache in the device can flatter a model "
        "this small\n",
        human_bytes(double(p.token_bytes_estimate())), r.mixed.passes);
  s += phase_line(fmt::format("token pattern (trunk + {} experts)", p.top_k).c_str(), r.mixed);
  s += phase_line(
      fmt::format("trunk reads (largest {})", human_bytes(double(p.largest_trunk_read()))).c_str(), r.trunk);
  s += phase_line(
      fmt::format("expert reads ({} windows)", human_bytes(double(p.largest_expert_read()))).c_str(),
      r.experts);
  return s;
}

namespace {

// Keeps a reader busy with requests from `next` until `seconds` have passed: requests are submitted
// while fewer than `window` bytes are outstanding, so the reader always has chunks queued behind
// the ones in the kernel. Every request lands in `dst` (shared: the bytes are discarded).
struct Outstanding {
  std::mutex m;
  std::condition_variable cv;
  uint64_t bytes = 0, done_bytes = 0, done_requests = 0;
  std::string error;
};

template <class Next>
void keep_busy(io::UringReader& reader, Outstanding& st, uint64_t window, double seconds, Next next) {
  auto on_done = [&st](const io::ReadCompletion& c) {
    {
      std::lock_guard lock(st.m);
      st.bytes -= c.dst.size();
      if (c.ok()) {
        st.done_bytes += c.dst.size();
        ++st.done_requests;
      } else if (st.error.empty()) {
        st.error = c.message.empty() ? fmt::format("read failed: errno {}", c.error) : c.message;
      }
    }
    st.cv.notify_all();
  };
  // The first window goes in one batch (one wake-up of the reader), so the reader fills its whole
  // queue depth at once whatever the device's latency: the depth reached does not depend on timing.
  std::vector<io::ReadRequest> first;
  uint64_t queued = 0;
  while (queued < window) {
    first.push_back(next());
    queued += first.back().dst.size();
  }
  {
    std::lock_guard lock(st.m);
    st.bytes += queued;
  }
  reader.submit(first, on_done);
  const double t0 = now_seconds();
  while (now_seconds() - t0 < seconds) {
    {
      std::unique_lock lock(st.m);
      st.cv.wait(lock, [&] { return st.bytes < window || !st.error.empty(); });
      if (!st.error.empty()) break;
    }
    io::ReadRequest req = next();
    {
      std::lock_guard lock(st.m);
      st.bytes += req.dst.size();
    }
    reader.submit(req, on_done);
  }
  reader.wait_idle();
}

CeilingPhase run_ceiling_phase(const io::UringReader::Options& ro, uint64_t window, double seconds,
                               uint64_t request_bytes, const std::function<io::ReadRequest()>& next) {
  io::UringReader reader(ro);
  Outstanding st;
  const double t0 = now_seconds();
  keep_busy(reader, st, window, seconds, next);
  CeilingPhase r;
  r.seconds = now_seconds() - t0;
  r.bytes = st.done_bytes;
  r.requests = st.done_requests;
  r.request_bytes = request_bytes;
  const io::ReaderCounters c = reader.counters();
  r.direct_bytes = c.direct_bytes;
  r.peak_in_flight = c.peak_in_flight;
  if (!st.error.empty()) throw io::runtime_error("device ceiling probe: " + st.error);
  return r;
}

}  // namespace

CeilingResult probe_ceiling(const ProbePattern& p, const CeilingOptions& o) {
  if (o.queue_depth == 0) throw io::usage_error("device ceiling probe: queue depth must be at least 1");
  if (o.chunk_bytes < kDirectAlign || o.chunk_bytes % kDirectAlign != 0)
    throw io::usage_error(fmt::format(
        "device ceiling probe: chunk of {} bytes is not a positive multiple of 4096", o.chunk_bytes));
  CeilingResult r;
  r.source = p.source;
  r.queue_depth = o.queue_depth;
  r.chunk_bytes = o.chunk_bytes;
  io::UringReader::Options ro;
  ro.queue_depth = o.queue_depth;
  ro.chunk_bytes = o.chunk_bytes;
  ro.force_pread = o.force_pread;
  {
    io::UringReader info(ro);
    r.backend = io::backend_name(info.backend());
    r.fallback_reason = info.fallback_reason();
  }
  // Twice the depth outstanding: while the kernel holds queue_depth chunks, as many wait their turn.
  const uint64_t window = 2 * uint64_t(o.queue_depth) * o.chunk_bytes;

  // ---- sequential: the files front to back, one chunk per request, wrapping around ----
  std::vector<const io::File*> files;
  for (const io::File* f : p.files)
    if (f && align_down(f->size(), kDirectAlign) >= kDirectAlign) files.push_back(f);
  if (files.empty()) throw io::usage_error("device ceiling probe: no file of at least 4096 bytes to read");
  uint64_t span = 0;
  for (const io::File* f : files) span += align_down(f->size(), kDirectAlign);
  uint64_t biggest = o.chunk_bytes;
  std::vector<ProbeRange> experts;
  for (const ProbeLayer& l : p.layers)
    for (const ProbeRange& e : l.experts) experts.push_back(e);
  uint64_t rng = o.seed;
  if (experts.empty()) {
    r.random_source = "random windows";
    for (const io::File* f : files) {
      const uint64_t usable = align_down(f->size(), kDirectAlign);
      const uint64_t bytes = std::min<uint64_t>(align_up(o.random_bytes, kDirectAlign), usable);
      // as many windows as the file holds, at random aligned offsets drawn below
      for (uint64_t i = 0; i < std::max<uint64_t>(1, usable / bytes); ++i) experts.push_back({f, 0, bytes});
    }
  } else {
    r.random_source = "expert windows";
  }
  for (const ProbeRange& e : experts) biggest = std::max(biggest, e.bytes);
  biggest = align_up(biggest, kDirectAlign);
  // The destination area: every request in flight or queued lands in a place of its own, and the
  // area is far larger than any CPU cache, as the engine's ring slots are.
  const uint64_t area =
      std::max(biggest, o.dest_bytes ? align_up(o.dest_bytes, kDirectAlign)
                                     : std::max(kDefaultDestBytes, align_up(window, kDirectAlign)));
  io::AlignedBuffer dst(area);  // zero-filled: its pages are faulted in before timing
  r.dest_bytes = area;
  uint64_t dst_at = 0;
  auto place = [&](uint64_t n) {  // the next place for n bytes, wrapping around the area
    if (dst_at + n > area) dst_at = 0;
    std::byte* at = dst.data() + dst_at;
    dst_at = align_up(dst_at + n, kDirectAlign);
    return std::span<std::byte>(at, size_t(n));
  };

  size_t fi = 0;
  uint64_t off = 0;
  int passes = 0;
  auto next_sequential = [&] {
    const io::File* f = files[fi];
    const uint64_t end = align_down(f->size(), kDirectAlign);
    const uint64_t n = std::min<uint64_t>(o.chunk_bytes, end - off);
    io::ReadRequest req{f, off, place(n), 0};
    off += n;
    if (off >= end) {
      off = 0;
      if (++fi == files.size()) {
        fi = 0;
        ++passes;
      }
    }
    return req;
  };
  r.sequential = run_ceiling_phase(ro, window, o.seconds * 0.6, o.chunk_bytes, next_sequential);
  r.sequential.passes = passes;
  r.sequential.span_bytes = span;

  // ---- random: expert windows (or random aligned windows) picked uniformly ----
  uint64_t random_span = 0, largest = 0;
  for (const ProbeRange& e : experts) {
    random_span += e.bytes;
    largest = std::max(largest, e.bytes);
  }
  const bool synthetic = r.random_source == "random windows";
  r.random = run_ceiling_phase(ro, std::max(window, 2 * largest), o.seconds * 0.4, largest, [&] {
    const ProbeRange& e = experts[splitmix64(rng) % experts.size()];
    uint64_t at = e.offset;
    if (synthetic) {
      const uint64_t slots = (align_down(e.file->size(), kDirectAlign) - e.bytes) / kDirectAlign + 1;
      at = (splitmix64(rng) % slots) * kDirectAlign;
    }
    return io::ReadRequest{e.file, at, place(e.bytes), 0};
  });
  r.random.span_bytes = synthetic ? span : random_span;

  // ---- the CPU a compute thread keeps: spinners with the device quiet, then beside reads ----
  if (o.cpu_threads > 0) {
    r.cpu_quiet = measure_cpu_share(o.cpu_threads, {}, o.cpu_seconds / 2);
    r.cpu_reading = measure_cpu_share(o.cpu_threads, [&] {  // the sequential pattern again, from where it was
      r.beside_spinners = run_ceiling_phase(ro, window, o.cpu_seconds, o.chunk_bytes, next_sequential);
    });
  }
  return r;
}

std::string format_ceiling(const CeilingResult& r) {
  std::string s = fmt::format(
      "device ceiling: {} with {} x {} KiB in flight, O_DIRECT, reading {} into {} of memory (independent "
      "of the engine's reader settings)\n",
      r.backend, r.queue_depth, r.chunk_bytes >> 10, r.source, human_bytes(double(r.dest_bytes)));
  if (!r.fallback_reason.empty()) s += fmt::format("  (pread fallback: {})\n", r.fallback_reason);
  auto line = [&](const char* what, const CeilingPhase& c) {
    if (c.bytes == 0) return fmt::format("  {:<34} -\n", what);
    const double direct = 100.0 * double(c.direct_bytes) / double(c.bytes);
    return fmt::format(
        "  {:<34} {:7.3f} GB/s  ({} in {:.2f} s, {} requests of up to {}, {} chunks in flight at most, "
        "O_DIRECT {:.1f}%)\n",
        what, c.gbps(), human_bytes(double(c.bytes)), c.seconds, c.requests,
        human_bytes(double(c.request_bytes)), c.peak_in_flight, direct);
  };
  s += line("sequential (files front to back)", r.sequential);
  s += line(fmt::format("random ({})", r.random_source).c_str(), r.random);
  if (r.sequential.passes >= 2)
    s += fmt::format(
        "  NOTE: the files ({}) were read {} times over: a cache in the device or host can flatter a model "
        "this small\n",
        human_bytes(double(r.sequential.span_bytes)), r.sequential.passes);
  if (r.cpu_reading.measured())
    s += fmt::format(
        "  CPU kept by {} spinning thread{} while these reads stream: {:.3f} of their time (device quiet: "
        "{:.3f}); longest stall {:.1f} ms; the reads beside them {:.3f} GB/s ({:.3f} of the sequential "
        "rate)\n",
        r.cpu_reading.threads, r.cpu_reading.threads == 1 ? "" : "s", r.cpu_reading.share, r.cpu_quiet.share,
        r.cpu_reading.longest_gap * 1e3, r.beside_spinners.gbps(), r.read_share_beside());
  const uint64_t all = r.sequential.bytes + r.random.bytes;
  if (all && double(r.sequential.direct_bytes + r.random.direct_bytes) < 0.99 * double(all))
    s +=
        "  NOTE: part of the reads were buffered (O_DIRECT refused): the page cache may flatter the figure\n";
  return s;
}

}  // namespace k3::pipeline
