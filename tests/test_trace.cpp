// The trace recorder writes valid Chrome trace JSON: every event has the fields its phase needs,
// events from several threads land in one file, nothing is recorded while tracing is off, and spans
// recorded on a track land on its named virtual row (a lane each when they overlap).
#include <doctest/doctest.h>
#include <simdjson.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "io/error.hpp"
#include "pipeline/graph/trace.hpp"

using k3::pipeline::Trace;
using k3::pipeline::TraceArgs;
using k3::pipeline::TraceSpan;

TEST_CASE("trace: off records nothing, on records spans, async reads and counters from threads") {
  Trace::clear();
  Trace::disable();
  { TraceSpan s("ignored", "compute"); }
  Trace::counter("ignored", 1);
  CHECK(Trace::event_count() == 0);

  const auto enabled_at = std::chrono::steady_clock::now();
  Trace::enable();
  Trace::name_thread("main");
  { TraceSpan s("attention", "compute", TraceArgs{.layer = 3}); }
  std::thread worker([] {
    Trace::name_thread("reader");
    Trace::async_begin("trunk_read", "io", 42,
                       TraceArgs{.layer = 4, .slot = 1, .bytes = 4096, .offset = 8192});
    Trace::counter("bytes_in_flight", 4096);
    Trace::async_end("trunk_read", "io", 42);
  });
  worker.join();
  Trace::disable();
  CHECK(Trace::event_count() == 6);

  auto path = std::filesystem::temp_directory_path() / "k3flow_test_trace.json";
  Trace::write(path);
  simdjson::dom::parser parser;
  simdjson::dom::element doc = parser.load(path.string());
  // ts 0 on the steady clock (CLOCK_MONOTONIC), to line the trace up with `perf record -k CLOCK_MONOTONIC`.
  const auto us = [](std::chrono::steady_clock::time_point t) {
    return std::chrono::duration_cast<std::chrono::microseconds>(t.time_since_epoch()).count();
  };
  const int64_t origin = int64_t(doc["otherData"]["monotonic_origin_us"]);
  CHECK(origin >= us(enabled_at));
  CHECK(origin <= us(std::chrono::steady_clock::now()));
  std::set<std::string> phases;
  std::set<int64_t> tids;
  for (simdjson::dom::object ev : doc["traceEvents"].get_array()) {
    std::string ph{std::string_view(ev["ph"])};
    phases.insert(ph);
    CHECK(ev["name"].is_string());
    CHECK(ev["pid"].is_int64());
    CHECK(ev["tid"].is_int64());
    if (ph == "M") continue;
    tids.insert(int64_t(ev["tid"]));
    CHECK(ev["ts"].is_int64());
    if (ph == "X") {
      CHECK(ev["dur"].is_int64());
      CHECK(int64_t(ev["args"]["layer"]) == 3);
    }
    if (ph == "b" || ph == "e") CHECK(int64_t(ev["id"]) == 42);
    if (ph == "b") {
      CHECK(int64_t(ev["args"]["bytes"]) == 4096);
      CHECK(int64_t(ev["args"]["offset"]) == 8192);
      CHECK(int64_t(ev["args"]["slot"]) == 1);
    }
    if (ph == "C") CHECK(int64_t(ev["args"]["value"]) == 4096);
  }
  CHECK(phases == std::set<std::string>{"M", "X", "b", "e", "C"});
  CHECK(tids.size() == 2);
  std::filesystem::remove(path);
}

TEST_CASE("trace: an unwritable path is a one-line error naming it, and leaves no file") {
  Trace::clear();
  std::filesystem::path bad = "/nonexistent-dir/trace.json";
  try {
    Trace::write(bad);
    FAIL("expected an error");
  } catch (const std::exception& e) {
    CHECK(std::string(e.what()).find(bad.string()) != std::string::npos);
  }
  CHECK(!std::filesystem::exists(bad));
}

TEST_CASE("trace: a directory at the path is an io::Error naming it, and leaves no temporary beside it") {
  Trace::clear();
  const std::filesystem::path parent =
      std::filesystem::temp_directory_path() / ("k3_trace_dir_" + std::to_string(::getpid()));
  std::filesystem::remove_all(parent);
  std::filesystem::create_directories(parent / "trace.json");
  try {
    Trace::write(parent / "trace.json");
    FAIL("expected an error");
  } catch (const k3::io::Error& e) {
    const std::string m = e.what();
    CHECK_MESSAGE(m.find((parent / "trace.json").string()) != std::string::npos, m);
    CHECK_MESSAGE(m.find("directory") != std::string::npos, m);
    CHECK(m.find('\n') == std::string::npos);
  }
  std::vector<std::string> left;
  for (const auto& e : std::filesystem::directory_iterator(parent)) left.push_back(e.path().filename());
  CHECK(left == std::vector<std::string>{"trace.json"});
  std::filesystem::remove_all(parent);
}

TEST_CASE("trace: spans on a track land on its virtual tid, named once; concurrent spans take lanes") {
  Trace::clear();
  Trace::enable();
  k3::pipeline::TraceTrack node("node: expert_compute", 2), reader("reader: trunk"), unused("node: never");
  CHECK(node.tid() >= Trace::kFirstTrackTid);
  CHECK(reader.tid() != node.tid());
  CHECK(reader.tid() != node.tid() + 1);  // node took two tids
  k3::pipeline::TraceTrack again("node: expert_compute", 2);
  CHECK(again.tid() == node.tid());  // the same track registered twice: the same rows
  {
    TraceSpan a(node, "expert_compute", "compute", TraceArgs{.layer = 1, .expert = 7});
    {
      TraceSpan b(node, "expert_compute", "compute", TraceArgs{.layer = 1, .expert = 9});   // lane 2
      TraceSpan c(node, "expert_compute", "compute", TraceArgs{.layer = 1, .expert = 11});  // no lane left
    }
  }
  { TraceSpan d(node, "expert_compute", "compute", TraceArgs{.layer = 2}); }  // lane 1 is free again
  Trace::async_begin("trunk read", "io", 7, TraceArgs{.bytes = 4096}, reader.tid());
  Trace::async_end("trunk read", "io", 7, reader.tid());
  Trace::disable();

  auto path = std::filesystem::temp_directory_path() / "k3flow_test_trace_tracks.json";
  Trace::write(path);
  simdjson::dom::parser parser;
  simdjson::dom::element doc = parser.load(path.string());
  std::map<int64_t, std::string> names;
  std::map<int64_t, int> spans;  // tid -> X events
  std::set<int64_t> read_tids;
  for (simdjson::dom::object ev : doc["traceEvents"].get_array()) {
    const std::string_view ph = ev["ph"];
    const int64_t tid = ev["tid"];
    if (ph == "M" && std::string_view(ev["name"]) == "thread_name")
      names[tid] = std::string(std::string_view(ev["args"]["name"]));
    if (ph == "X") ++spans[tid];
    if (ph == "b" || ph == "e") read_tids.insert(tid);
  }
  CHECK(spans[node.tid()] == 2);      // a, then d once a had ended
  CHECK(spans[node.tid() + 1] == 1);  // b
  CHECK(spans.size() == 3);           // c: on this thread's own row
  CHECK(spans.begin()->first < Trace::kFirstTrackTid);
  CHECK(read_tids == std::set<int64_t>{reader.tid()});
  CHECK(names[node.tid()] == "node: expert_compute");
  CHECK(names[node.tid() + 1] == "node: expert_compute #2");
  CHECK(names[reader.tid()] == "reader: trunk");
  CHECK(names.count(unused.tid()) == 0);  // a track without events is not written
  std::filesystem::remove(path);
}
