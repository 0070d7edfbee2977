#include "pipeline/graph/trace.hpp"

#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cstdio>
#include <memory>
#include <mutex>
#include <set>
#include <utility>
#include <vector>

#include "io/error.hpp"
#include "pipeline/support/output_file.hpp"

namespace k3::pipeline {

namespace {

enum class Phase : char { complete = 'X', begin = 'b', end = 'e', counter = 'C', thread_name = 'M' };

struct Event {
  Phase phase;
  const char* name;
  const char* cat;
  uint64_t ts, dur, id;
  int64_t value;
  TraceArgs args;
  std::string label;  // thread name metadata only
  int tid = 0;        // a track's virtual tid; 0: the recording thread's
};

struct ThreadBuffer {
  int tid;
  std::vector<Event> events;
};

struct Registry {
  std::mutex mu;  // taken when a thread first records and when writing, never per event
  std::vector<std::unique_ptr<ThreadBuffer>> buffers;
  std::vector<std::string> tracks;  // names of virtual tids kFirstTrackTid, kFirstTrackTid + 1, ...
  std::vector<std::pair<std::string, int>> track_keys;  // "name/lanes" of each registration, its first tid
  std::chrono::steady_clock::time_point t0 = std::chrono::steady_clock::now();
};

Registry& registry() {
  static Registry r;
  return r;
}

ThreadBuffer& local_buffer() {
  thread_local ThreadBuffer* buf = nullptr;
  if (!buf) {
    auto owned = std::make_unique<ThreadBuffer>();
    owned->tid = static_cast<int>(::syscall(SYS_gettid));
    owned->events.reserve(4096);
    buf = owned.get();
    std::lock_guard lock(registry().mu);
    registry().buffers.push_back(std::move(owned));
  }
  return *buf;
}

void append(Event e) {
  local_buffer().events.push_back(std::move(e));
}

void json_string(std::string& out, std::string_view s) {
  out += '"';
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char esc[8];
      std::snprintf(esc, sizeof esc, "\\u%04x", c);
      out += esc;
    } else {
      out += c;
    }
  }
  out += '"';
}

void json_args(std::string& out, const TraceArgs& a) {
  out += ",\"args\":{";
  bool first = true;
  auto field = [&](const char* k, int64_t v) {
    if (v < 0) return;
    if (!first) out += ',';
    first = false;
    out += '"';
    out += k;
    out += "\":";
    out += std::to_string(v);
  };
  field("layer", a.layer);
  field("expert", a.expert);
  field("slot", a.slot);
  field("bytes", a.bytes);
  field("offset", a.offset);
  field("token", a.token);
  field("rows", a.rows);
  field("drafted", a.drafted);
  field("accepted", a.accepted);
  field("emitted", a.emitted);
  out += '}';
}

}  // namespace

std::atomic<bool> Trace::enabled_{false};

void Trace::enable() {
  registry().t0 = std::chrono::steady_clock::now();
  enabled_.store(true, std::memory_order_relaxed);
}

void Trace::disable() {
  enabled_.store(false, std::memory_order_relaxed);
}

void Trace::clear() {
  std::lock_guard lock(registry().mu);
  for (auto& b : registry().buffers) b->events.clear();
}

uint64_t Trace::now_us() {
  auto d = std::chrono::steady_clock::now() - registry().t0;
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::microseconds>(d).count());
}

void Trace::complete(const char* name, const char* cat, uint64_t begin_us, uint64_t end_us,
                     const TraceArgs& args, int tid) {
  if (!enabled()) return;
  append(
      {Phase::complete, name, cat, begin_us, end_us > begin_us ? end_us - begin_us : 0, 0, 0, args, {}, tid});
}

void Trace::async_begin(const char* name, const char* cat, uint64_t id, const TraceArgs& args, int tid) {
  if (!enabled()) return;
  append({Phase::begin, name, cat, now_us(), 0, id, 0, args, {}, tid});
}

void Trace::async_end(const char* name, const char* cat, uint64_t id, int tid) {
  if (!enabled()) return;
  append({Phase::end, name, cat, now_us(), 0, id, 0, {}, {}, tid});
}

void Trace::counter(const char* name, int64_t value) {
  if (!enabled()) return;
  append({Phase::counter, name, "counter", now_us(), 0, 0, value, {}, {}});
}

void Trace::name_thread(const std::string& name) {
  if (!enabled()) return;
  append({Phase::thread_name, "thread_name", "__metadata", 0, 0, 0, 0, {}, name});
}

int Trace::register_track(const std::string& name, int lanes) {
  lanes = std::clamp(lanes, 1, 64);
  Registry& r = registry();
  std::lock_guard lock(r.mu);
  const std::string key = name + "/" + std::to_string(lanes);
  for (const auto& [k, first] : r.track_keys)
    if (k == key) return first;  // the same rows for the same track (another model in this process)
  const int first = kFirstTrackTid + int(r.tracks.size());
  for (int i = 0; i < lanes; ++i) r.tracks.push_back(i == 0 ? name : name + " #" + std::to_string(i + 1));
  r.track_keys.emplace_back(key, first);
  return first;
}

TraceTrack::TraceTrack(const std::string& name, int lanes)
    : first_(Trace::register_track(name, lanes)), lanes_(std::clamp(lanes, 1, 64)) {}

int TraceTrack::take() {
  uint64_t busy = busy_.load(std::memory_order_relaxed);
  for (;;) {
    const int lane = std::countr_one(busy);
    if (lane >= lanes_) return 0;  // every lane busy: the recording thread's own row
    if (busy_.compare_exchange_weak(busy, busy | (uint64_t{1} << lane), std::memory_order_acquire,
                                    std::memory_order_relaxed))
      return first_ + lane;
  }
}

void TraceTrack::give(int tid) {
  if (tid >= first_ && tid < first_ + lanes_)
    busy_.fetch_and(~(uint64_t{1} << (tid - first_)), std::memory_order_release);
}

size_t Trace::event_count() {
  std::lock_guard lock(registry().mu);
  size_t n = 0;
  for (auto& b : registry().buffers) n += b->events.size();
  return n;
}

void Trace::write(const std::filesystem::path& path) {
  // otherData.monotonic_origin_us: the steady clock (CLOCK_MONOTONIC on Linux) at ts 0, so a trace
  // lines up with `perf record -k CLOCK_MONOTONIC` (scheduler events, samples) of the same run.
  const auto origin = std::chrono::duration_cast<std::chrono::microseconds>(registry().t0.time_since_epoch());
  std::string out =
      "{\"displayTimeUnit\":\"ms\",\"otherData\":{\"monotonic_origin_us\":" + std::to_string(origin.count()) +
      "},\"traceEvents\":[\n";
  const int pid = static_cast<int>(::getpid());
  out += "{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":" + std::to_string(pid) +
         ",\"tid\":0,\"args\":{\"name\":\"k3flow\"}}";
  {
    std::lock_guard lock(registry().mu);
    std::set<int> used_tracks;
    for (auto& b : registry().buffers) {
      for (const Event& e : b->events) {
        const int tid = e.tid != 0 ? e.tid : b->tid;
        if (e.tid != 0) used_tracks.insert(e.tid);
        out += ",\n{\"ph\":\"";
        out += static_cast<char>(e.phase);
        out += "\",\"name\":";
        json_string(out, e.name);
        if (e.phase != Phase::thread_name) {
          out += ",\"cat\":";
          json_string(out, e.cat);
        }
        out += ",\"pid\":" + std::to_string(pid) + ",\"tid\":" + std::to_string(tid) +
               ",\"ts\":" + std::to_string(e.ts);
        switch (e.phase) {
          case Phase::complete:
            out += ",\"dur\":" + std::to_string(e.dur);
            json_args(out, e.args);
            break;
          case Phase::begin:
            out += ",\"id\":" + std::to_string(e.id);
            json_args(out, e.args);
            break;
          case Phase::end:
            out += ",\"id\":" + std::to_string(e.id);
            break;
          case Phase::counter:
            out += ",\"args\":{\"value\":" + std::to_string(e.value) + "}";
            break;
          case Phase::thread_name:
            out += ",\"args\":{\"name\":";
            json_string(out, e.label);
            out += "}";
            break;
        }
        out += '}';
      }
    }
    for (int tid : used_tracks) {
      const size_t i = size_t(tid - kFirstTrackTid);
      if (i >= registry().tracks.size()) continue;
      out += ",\n{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":" + std::to_string(pid) +
             ",\"tid\":" + std::to_string(tid) + ",\"ts\":0,\"args\":{\"name\":";
      json_string(out, registry().tracks[i]);
      out += "}}";
    }
  }
  out += "\n]}\n";
  // Removes its temporary on every failure (a directory at `path` included) and throws io::Error.
  write_file_atomic(path, out);
}

}  // namespace k3::pipeline
