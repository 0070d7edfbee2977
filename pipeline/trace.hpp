// Chrome trace event recorder (opens in Perfetto and chrome://tracing). Off by default: every
// record call is then one relaxed atomic load and a branch. When on, each thread appends to its own
// buffer (no locks on the hot path); buffers are merged only when the trace is written.
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
};

class Trace {
 public:
  static bool enabled() { return enabled_.load(std::memory_order_relaxed); }
  static void enable();   // starts the clock at 0
  static void disable();  // stops recording (keeps what was recorded)
  static void clear();

  static uint64_t now_us();  // microseconds since enable()

  // Names and categories must be string literals (stored as pointers).
  static void complete(const char* name, const char* cat, uint64_t begin_us, uint64_t end_us,
                       const TraceArgs& args = {});                                    // ph X
  static void async_begin(const char* name, const char* cat, uint64_t id, const TraceArgs& args = {});  // ph b
  static void async_end(const char* name, const char* cat, uint64_t id);                               // ph e
  static void counter(const char* name, int64_t value);                                                // ph C
  static void name_thread(const std::string& name);                                                    // metadata

  // Writes every thread's events as one JSON object {"traceEvents":[...],"displayTimeUnit":"ms"}
  // to a temporary name, then renames. Throws k3::io::Error naming the path on failure.
  static void write(const std::filesystem::path& path);
  static size_t event_count();

 private:
  static std::atomic<bool> enabled_;
};

// RAII complete-span: records [construction, destruction) when tracing is on.
class TraceSpan {
 public:
  TraceSpan(const char* name, const char* cat, const TraceArgs& args = {})
      : name_(name), cat_(cat), args_(args), begin_(Trace::enabled() ? Trace::now_us() : 0),
        on_(Trace::enabled()) {}
  ~TraceSpan() {
    if (on_) Trace::complete(name_, cat_, begin_, Trace::now_us(), args_);
  }
  TraceSpan(const TraceSpan&) = delete;
  TraceSpan& operator=(const TraceSpan&) = delete;

 private:
  const char* name_;
  const char* cat_;
  TraceArgs args_;
  uint64_t begin_;
  bool on_;
};

}  // namespace k3::pipeline
