// `k3flow generate` streamed through the flow graph (pipeline/run/streaming_run.*, graph.*), driven as
// a child process (K3FLOW_BIN) on checkpoints written by `k3flow synth` into a temp dir and on
// fixtures/tiny-k3:
//   - identical bits: --dump-logits bytes and generated ids equal the resident run's, with and
//     without --trunk, for every strategy, budgets from the floor to everything resident, 1 and 2
//     threads, full recompute and --incremental;
//   - the budget holds: a checkpoint >= 3x the budget decodes with the child's peak RSS (wait4) under it;
//   - real io_uring: uring_bytes == trunk + expert bytes read, pread_bytes == 0; K3FLOW_NO_URING=1
//     gives the same bits with uring_bytes == 0;
//   - faults: a shard truncated between tokens, an unreadable / truncated trunk, a config.json that
//     cannot be trusted -> one line naming the file, exit 1 (an interrupted pack, no trunk.json:
//     exit 2, --trunk names no packed trunk), no hang, no report and no logits file;
//   - the run report's field names, the trace and the graph dump.
// Every child runs under a time bound.
#include <doctest/doctest.h>
#include <fmt/format.h>
#include <simdjson.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "tests/generate_helpers.hpp"
#include "tests/run_helpers.hpp"

namespace fs = std::filesystem;
using k3::test::field;
using k3::test::generate;
using k3::test::k3flow;
using k3::test::kTinyFull;
using k3::test::kTinyK3;
using k3::test::num;
using k3::test::Output;
using k3::test::Run;
using k3::test::slurp;
using k3::test::TempDir;

namespace {

// 8 layers (dense 0, MoE 1..7, MLA 3 and 7), 32 experts, top-4: ~14 MB in 3 shards.
struct Synth {
  TempDir dir;
  std::string model, trunk;
  Synth() {
    model = dir / "m";
    trunk = dir / "t";
    Run s = k3flow(fmt::format("synth {} --size tiny --layers 8 --shards 3 --seed 4", model));
    REQUIRE_MESSAGE(s.code == 0, s.err);
    Run p = k3flow(fmt::format("pack-trunk {} {}", model, trunk));
    REQUIRE_MESSAGE(p.code == 0, p.err);
  }
};

Synth& synth() {
  static Synth s;
  return s;
}

const char* const kStrategies[] = {"serial", "trunk", "overlap", "lookahead", "auto"};

}  // namespace

TEST_CASE(
    "synthetic checkpoint: streamed == resident bits for every strategy, budget, source, mode, threads") {
  Synth& s = synth();
  TempDir d;
  const std::string ids = "5,900,17,17,3,640,201,88";
  // Under a sanitizer (.ci/sanitize, .ci/tsan: every run 4-12x slower) two budgets instead of three:
  // the floor (streaming, evicting) and the preset. Every strategy, source and mode still runs
  // streamed there, which is what ASan and TSan look at; the normal build keeps the whole matrix.
  const std::vector<const char*> budgets =
      k3::test::kSanitized ? std::vector<const char*>{"--preset ultra", "--mem-gb 0.02"}
                           : std::vector<const char*>{"--preset ultra", "--mem-gb 0.02", "--mem-gb 1"};
  for (const char* mode : {"--incremental", ""}) {
    CAPTURE(mode);
    const Output ref = generate(s.model, ids, fmt::format("--gen 4 {}", mode), d);
    CHECK(field(ref.report, "strategy") == "\"resident\"");
    for (const char* budget : budgets)
      for (const char* strategy : kStrategies)
        for (bool trunk : {false, true}) {
          if (*mode == 0 && trunk && std::string(budget) != "--preset ultra") continue;  // keep it short
          const std::string flags = fmt::format("--gen 4 {} {} --strategy {} {}", mode, budget, strategy,
                                                trunk ? "--trunk " + s.trunk : "");
          CAPTURE(flags);
          const Output o = generate(s.model, ids, flags, d);
          CHECK(o.ids == ref.ids);
          CHECK(o.logits == ref.logits);
          CHECK(field(o.report, "strategy") == fmt::format("\"{}\"", strategy));
        }
  }
  for (const char* threads : {"--threads 1", "--threads 2"}) {
    CAPTURE(threads);
    const Output ref = generate(s.model, ids, fmt::format("--gen 3 --incremental {}", threads), d);
    for (const char* strategy : {"serial", "lookahead"}) {
      const Output o = generate(
          s.model, ids,
          fmt::format("--gen 3 --incremental --preset ultra --strategy {} {}", strategy, threads), d);
      CHECK(o.ids == ref.ids);
      CHECK(o.logits == ref.logits);
    }
  }
}

TEST_CASE(
    "fixtures/tiny-k3 streamed at the floor: the golden logits, from the shards and from a packed trunk") {
  TempDir d;
  REQUIRE(k3flow(fmt::format("pack-trunk {} {}", kTinyK3, d / "trunk")).code == 0);
  const std::string golden = slurp(std::string(K3_FIXTURES) + "/golden/tiny_c_logits.bin");
  for (const char* strategy : kStrategies)
    for (const std::string& trunk : {std::string(), "--trunk " + d / "trunk"}) {
      CAPTURE(strategy);
      CAPTURE(trunk);
      const Output o = generate(kTinyK3, kTinyFull,
                                fmt::format("--gen 1 --preset ultra --strategy {} {}", strategy, trunk), d);
      CHECK(o.logits == golden);
      CHECK(o.ids == "6");
    }
  // An unseen prompt, 6 tokens incremental, at the floor and with room for a cache and lookahead.
  const Output ref = generate(kTinyK3, "17,250,3,3,3,99,0,128", "--gen 6 --incremental", d);
  for (const char* strategy : kStrategies)
    for (const char* budget : {"--preset ultra", "--mem-gb 0.05"}) {
      CAPTURE(strategy);
      CAPTURE(budget);
      const Output o = generate(kTinyK3, "17,250,3,3,3,99,0,128",
                                fmt::format("--gen 6 --incremental {} --strategy {}", budget, strategy), d);
      CHECK(o.ids == ref.ids);
      CHECK(o.logits == ref.logits);
      if (std::string(strategy) == "auto")  // at the floor there are no lookahead slots: nothing to choose
        CHECK(o.out.find(std::string(budget) == "--preset ultra"
                             ? "auto: no expert prefetch possible"
                             : "auto: expert prefetch o") != std::string::npos);
    }
}

TEST_CASE("report: field names, io_uring carries every byte, K3FLOW_NO_URING gives the same bits by pread") {
  Synth& s = synth();
  TempDir d;
  const Output a = generate(s.model, "1,2,3", "--gen 3 --incremental --mem-gb 0.02", d);
  for (const char* key : {"strategy", "threads", "budget_bytes", "trunk_bytes_read", "expert_bytes_read",
                          "expert_requests", "expert_hits", "lookahead_predicted", "lookahead_used",
                          "uring_bytes", "pread_bytes", "io_busy_seconds", "compute_busy_seconds",
                          "wall_seconds", "overlap_efficiency", "peak_rss_bytes", "tokens"})
    CHECK_MESSAGE(a.report.find(fmt::format("\"{}\":", key)) != std::string::npos, key);
  const std::string tokens = field(a.report, "tokens");
  for (const char* key : {"step", "token", "wall_seconds", "io_wait_seconds", "compute_seconds",
                          "trunk_bytes", "expert_bytes", "io_busy_seconds"})
    CHECK_MESSAGE(tokens.find(fmt::format("\"{}\":", key)) != std::string::npos, key);
  CHECK(field(a.report, "strategy") == "\"auto\"");  // the default
  CHECK(num(a.report, "budget_bytes") == uint64_t(std::llround(0.02 * (1 << 30))));
  const uint64_t read = num(a.report, "trunk_bytes_read") + num(a.report, "expert_bytes_read");
  CHECK(read > 0);
  CHECK(num(a.report, "uring_bytes") == read);
  CHECK(num(a.report, "pread_bytes") == 0);
  CHECK(num(a.report, "expert_hits") <= num(a.report, "expert_requests"));
  CHECK(num(a.report, "lookahead_used") <= num(a.report, "lookahead_predicted"));
  const double io = std::atof(field(a.report, "io_busy_seconds").c_str()),
               cpu = std::atof(field(a.report, "compute_busy_seconds").c_str()),
               eff = std::atof(field(a.report, "overlap_efficiency").c_str());
  CHECK(io > 0);
  CHECK(cpu > 0);
  CHECK(eff > 0);
  CHECK(eff <= 1.0);

  const Output b = generate(s.model, "1,2,3", "--gen 3 --incremental --mem-gb 0.02", d, "K3FLOW_NO_URING=1");
  CHECK(b.ids == a.ids);
  CHECK(b.logits == a.logits);
  CHECK(num(b.report, "uring_bytes") == 0);
  CHECK(num(b.report, "pread_bytes") ==
        num(b.report, "trunk_bytes_read") + num(b.report, "expert_bytes_read"));
}

TEST_CASE("the budget holds: a checkpoint over 3x the budget decodes with the child's peak RSS under it") {
  TempDir d;
  const std::string model = d / "small";
  REQUIRE(k3flow(fmt::format("synth {} --size small --seed 2", model)).code == 0);
  uint64_t on_disk = 0;
  for (const auto& e : fs::directory_iterator(model)) on_disk += fs::file_size(e.path());
  const double gb = 0.09;
  const uint64_t budget = uint64_t(std::llround(gb * (1 << 30)));
  REQUIRE(on_disk >= 3 * budget);
  const Run r = k3flow(fmt::format("generate {} --ids 7,8,9 --gen 3 --incremental --mem-gb {} --out {}",
                                   model, gb, d / "r.json"),
                       "", 120);
  REQUIRE_MESSAGE(r.code == 0, std::string(r.out + r.err));
  MESSAGE(fmt::format("small ({} MB on disk) at --mem-gb {} ({} B): child peak RSS {} B", on_disk / 1000000,
                      gb, budget, r.peak_rss));
#if defined(__SANITIZE_ADDRESS__) || defined(K3_SANITIZED)
  MESSAGE("sanitized build (K3_SANITIZED): shadow memory inflates RSS, the budget check is skipped");
#else
  CHECK(r.peak_rss <= budget);
  CHECK(num(slurp(d / "r.json"), "peak_rss_bytes") <= budget);
#endif

  const Run low =
      k3flow(fmt::format("generate {} --ids 7 --gen 1 --mem-gb 0.01 --out {}", model, d / "x.json"));
  CHECK(low.code == 2);
  CHECK(low.err.find("short of the floor") != std::string::npos);
  CHECK(!fs::exists(d / "x.json"));
}

TEST_CASE("faults: one line naming the file, exit 1, no hang, no output that looks complete") {
  Synth& s = synth();
  TempDir d;
  auto no_outputs = [&] {
    CHECK(!fs::exists(d / "r.json"));
    CHECK(!fs::exists(d / "l.bin"));
  };
  auto one_line = [](const std::string& err) { return !err.empty() && err.find('\n') == err.size() - 1; };

  SUBCASE("a shard truncated between tokens") {
    fs::copy(s.model, d / "m");
    const std::string victim = d / "m/model-00003-of-000003.safetensors";
    bool truncated = false;
    const Run r = k3flow(
        fmt::format("generate {} --ids 1,2,3 --gen 4 --incremental --preset ultra --dump-logits {} --out {}",
                    d / "m", d / "l.bin", d / "r.json"),
        "K3FLOW_TEST_STEP_DELAY_MS=1500", 60, [&](const std::string& out) {
          if (out.find("\n0      ") == std::string::npos) return true;
          fs::resize_file(victim, 4096);
          truncated = true;
          return false;
        });
    INFO(r.out);
    CHECK(truncated);
    CHECK(!r.timed_out);
    CHECK(r.code == 1);
    CHECK(r.err.find("model-00003-of-000003.safetensors") != std::string::npos);
    CHECK(one_line(r.err));
    no_outputs();
  }
  SUBCASE("trunk.bin truncated between tokens") {
    fs::copy(s.trunk, d / "t");
    bool truncated = false;
    const Run r =
        k3flow(fmt::format("generate {} --ids 1,2,3 --gen 4 --incremental --preset ultra --trunk {} "
                           "--dump-logits {} --out {}",
                           s.model, d / "t", d / "l.bin", d / "r.json"),
               "K3FLOW_TEST_STEP_DELAY_MS=1500", 60, [&](const std::string& out) {
                 if (out.find("\n0      ") == std::string::npos) return true;
                 fs::resize_file(d / "t/trunk.bin", 8192);
                 truncated = true;
                 return false;
               });
    INFO(r.out);
    CHECK(truncated);
    CHECK(r.code == 1);
    CHECK(r.err.find("trunk.bin") != std::string::npos);
    CHECK(one_line(r.err));
    no_outputs();
  }
  SUBCASE("an unreadable trunk file") {
    fs::create_directories(d / "t");
    fs::copy_file(s.trunk + "/trunk.json", d / "t/trunk.json");
    fs::create_directory(d / "t/trunk.bin");  // not a readable file, even for root
    const Run r =
        k3flow(fmt::format("generate {} --ids 1,2 --gen 2 --mem-gb 0.02 --trunk {} --dump-logits {} --out {}",
                           s.model, d / "t", d / "l.bin", d / "r.json"));
    CHECK(r.code == 1);
    CHECK(r.err.find("trunk.bin") != std::string::npos);
    CHECK(one_line(r.err));
    no_outputs();
  }
  SUBCASE("a pack interrupted half way") {
    const Run p = k3flow(fmt::format("pack-trunk {} {}", s.model, d / "t"),
                         "K3FLOW_FAIL_AFTER_BYTES=3000000 K3FLOW_FAIL_MODE=kill");
    CHECK(p.code != 0);
    const Run r =
        k3flow(fmt::format("generate {} --ids 1,2 --gen 2 --mem-gb 0.02 --trunk {} --dump-logits {} --out {}",
                           s.model, d / "t", d / "l.bin", d / "r.json"));
    // A killed pack leaves no trunk.json: --trunk names no packed trunk, a usage error (exit 2).
    CHECK(r.code == 2);
    CHECK(r.err.find("trunk.json") != std::string::npos);
    CHECK(one_line(r.err));
    no_outputs();
  }
  SUBCASE(
      "a config.json that cannot be trusted: the runtime error every command gives, resident or streamed") {
    fs::copy(s.model, d / "m");
    {
      std::ofstream f(d / "m/config.json", std::ios::trunc);
      f << "{\"model_type\": \"kimi_k3\", \"hidden_size\": \"wide\"";  // cut off, and a string size
    }
    const Run inspect = k3flow(fmt::format("inspect {}", d / "m"));
    CHECK(inspect.code == 1);
    for (const char* budget : {"", "--preset ultra"}) {
      CAPTURE(budget);
      const Run r = k3flow(fmt::format("generate {} --ids 1,2 --gen 2 {} --dump-logits {} --out {}", d / "m",
                                       budget, d / "l.bin", d / "r.json"));
      CHECK(r.code == 1);
      CHECK(r.err.find("config.json") != std::string::npos);
      CHECK(r.err.find("ABORTED") == std::string::npos);
      CHECK(one_line(r.err));
      CHECK(r.err == inspect.err);  // io/config.cpp's message as it is
      no_outputs();
    }
  }
}

TEST_CASE("--trace writes Chrome trace events; --graph-dot writes the graph annotated with the run") {
  Synth& s = synth();
  TempDir d;
  const Output o = generate(
      s.model, "1,2,3",
      fmt::format("--gen 2 --incremental --mem-gb 0.02 --trace {} --graph-dot {}", d / "t.json", d / "g.dot"),
      d);
  simdjson::dom::parser parser;
  simdjson::dom::element doc;
  REQUIRE(parser.load(d / "t.json").get(doc) == simdjson::SUCCESS);
  simdjson::dom::array events;
  REQUIRE(doc["traceEvents"].get_array().get(events) == simdjson::SUCCESS);
  int begins = 0, ends = 0, counters = 0, names = 0, attention = 0;
  for (simdjson::dom::element e : events) {
    std::string_view ph, name;
    REQUIRE(e["ph"].get_string().get(ph) == simdjson::SUCCESS);
    if (e["name"].get_string().get(name) != simdjson::SUCCESS) name = {};
    if (ph == "b") {
      ++begins;
      int64_t bytes = -1;
      CHECK(e["args"]["bytes"].get_int64().get(bytes) == simdjson::SUCCESS);
      CHECK(bytes > 0);
    }
    ends += ph == "e";
    counters += ph == "C";
    names += ph == "M";
    attention += ph == "X" && name == "attention";
  }
  CHECK(begins > 0);
  CHECK(begins == ends);
  CHECK(counters > 0);
  CHECK(names >= 2);          // the driver and at least one reader thread
  CHECK(attention == 2 * 8);  // 2 tokens x 8 layers
  const std::string dot = slurp(d / "g.dot");
  for (const char* node : {"trunk_read", "layer_gate", "attention", "expert_fetch", "expert_compute",
                           "combine", "trunk ring", "expert slots"})
    CHECK_MESSAGE(dot.find(node) != std::string::npos, node);
  CHECK(dot.find("16 items") != std::string::npos);  // attention ran 16 times
}
