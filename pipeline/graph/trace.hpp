// Chrome trace event recorder (opens in Perfetto and chrome://tracing). Off by default: every
// record call is then one relaxed atomic load and a branch. When on, each thread appends to its own
// buffer (no locks on the hot path); buffers are merged only when the trace is written.
//
// Rows: an event lands on the row of the thread that records it, or on a TraceTrack -- a named
// virtual thread ("node: attention", "reader: trunk") -- so a graph node's spans form one row
// whichever pool thread ran them, and a reader's reads sit under the reader, not the reaper thread.
#pragma once
#include <atomic>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <string>

namespace k3::pipeline {

// Optional event arguments; a field < 0 is absent from the JSON.
struct TraceArgs {
  int64_t layer = -1, expert = -1, slot = -1, bytes = -1, offset = -1, token = -1;
  // A speculative decode's pass (pipeline/run/speculative.hpp): rows fed, drafts, accepted, emitted.
  int64_t rows = -1, drafted = -1, accepted = -1, emitted = -1;
};

class Trace {
 public:
  static bool enabled() { return enabled_.load(std::memory_order_relaxed); }
  static void enable();   // starts the clock at 0
  static void disable();  // stops recording (keeps what was recorded)
  static void clear();

  static uint64_t now_us();  // microseconds since enable()

  // Names and categories must be string literals (stored as pointers). `tid`: 0 = the recording
  // thread's own row, else a TraceTrack's.
  static void complete(const char* name, const char* cat, uint64_t begin_us, uint64_t end_us,
                       const TraceArgs& args = {}, int tid = 0);  // ph X
  static void async_begin(const char* name, const char* cat, uint64_t id, const TraceArgs& args = {},
                          int tid = 0);                                                // ph b
  static void async_end(const char* name, const char* cat, uint64_t id, int tid = 0);  // ph e
  static void counter(const char* name, int64_t value);                                // ph C
  static void name_thread(const std::string& name);                                    // metadata

  // Registers `lanes` consecutive virtual tids named `name`, `name #2`, ... and returns the first.
  // Takes a lock: call it when building, not per event. Tracks outlive clear(); their names are
  // written (as thread_name metadata) for the tracks that have events. Virtual tids start at
  // kFirstTrackTid, above Linux's largest possible thread id (PID_MAX_LIMIT, 2^22).
  static int register_track(const std::string& name, int lanes);
  static constexpr int kFirstTrackTid = 1 << 24;

  // Writes every thread's events as one JSON object {"traceEvents":[...],"displayTimeUnit":"ms"}
  // to a temporary name, then renames. Throws k3::io::Error naming the path on failure.
  static void write(const std::filesystem::path& path);
  static size_t event_count();

 private:
  static std::atomic<bool> enabled_;
};

// A named row of its own (one per graph node, one per reader). Complete spans on one row must nest,
// so a track whose work runs concurrently (an unlimited-concurrency node) has lanes: a span takes
// the lowest free lane with one compare-exchange and gives it back when it ends; with every lane
// busy it falls back to the recording thread's row. Async (b/e) events may overlap: use tid().
class TraceTrack {
 public:
  explicit TraceTrack(const std::string& name, int lanes = 1);
  TraceTrack(const TraceTrack&) = delete;
  TraceTrack& operator=(const TraceTrack&) = delete;

  int tid() const { return first_; }
  int take();
  void give(int tid);

 private:
  int first_, lanes_;
  std::atomic<uint64_t> busy_{0};  // bit i: lane i holds an open span
};

// RAII complete-span: records [construction, destruction) when tracing is on, on the recording
// thread's row or on a lane of `track`.
class TraceSpan {
 public:
  TraceSpan(const char* name, const char* cat, const TraceArgs& args = {})
      : name_(name), cat_(cat), args_(args), on_(Trace::enabled()), begin_(on_ ? Trace::now_us() : 0) {}
  // The lane is taken before the clock is read and given back after, so spans on a lane never overlap.
  TraceSpan(TraceTrack& track, const char* name, const char* cat, const TraceArgs& args = {})
      : name_(name),
        cat_(cat),
        args_(args),
        on_(Trace::enabled()),
        track_(on_ ? &track : nullptr),
        tid_(on_ ? track.take() : 0),
        begin_(on_ ? Trace::now_us() : 0) {}
  ~TraceSpan() {
    if (!on_) return;
    Trace::complete(name_, cat_, begin_, Trace::now_us(), args_, tid_);
    if (track_) track_->give(tid_);
  }
  TraceSpan(const TraceSpan&) = delete;
  TraceSpan& operator=(const TraceSpan&) = delete;

 private:
  const char* name_;
  const char* cat_;
  TraceArgs args_;
  bool on_;
  TraceTrack* track_ = nullptr;
  int tid_ = 0;
  uint64_t begin_;
};

}  // namespace k3::pipeline
