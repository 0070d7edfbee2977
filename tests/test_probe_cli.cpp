// `k3flow probe` end to end (the binary, K3FLOW_BIN) on a tiny synthetic checkpoint: the ceiling is
// read with its own deep queue, not the engine's reader settings, --json prints one object with
// both, and bad input is one line with exit 2.
#include <doctest/doctest.h>
#include <fmt/format.h>
#include <simdjson.h>

#include <algorithm>
#include <string>

#include "tests/run_helpers.hpp"

using k3::test::TempDir;

namespace {

const std::string& tiny_model() {
  static TempDir dir(std::filesystem::current_path(), "k3probe_cli_");  // a real disk: O_DIRECT
  static std::string model;
  if (model.empty()) {
    model = dir / "tiny";
    const k3::test::Run r = k3::test::k3flow_sh(fmt::format("synth {} --size tiny --seed 3", model));
    REQUIRE_MESSAGE(r.code == 0, r.err);
    const k3::test::Run p = k3::test::k3flow_sh(fmt::format("pack-trunk {} {}", model, dir / "trunk"));
    REQUIRE_MESSAGE(p.code == 0, p.err);
  }
  return model;
}

std::string trunk_dir() {
  return (std::filesystem::path(tiny_model()).parent_path() / "trunk").string();
}

double num(simdjson::dom::element e) {
  double d;
  if (e.get(d) == simdjson::SUCCESS) return d;
  int64_t i = 0;
  REQUIRE(e.get(i) == simdjson::SUCCESS);
  return double(i);
}

}  // namespace

TEST_CASE("probe --json: the ceiling's deep queue beside the engine's settings, and their ratio") {
  const k3::test::Run r =
      k3::test::k3flow_sh(fmt::format("probe {} --trunk {} --seconds 0.3 --json", tiny_model(), trunk_dir()));
  INFO(r.err);
  REQUIRE(r.code == 0);
  simdjson::dom::parser parser;
  simdjson::dom::element doc;
  REQUIRE(parser.parse(r.out).get(doc) == simdjson::SUCCESS);
  CHECK(std::count(r.out.begin(), r.out.end(), '\n') == 1);
  CHECK(std::string_view(doc["source"]) == "trunk.bin");
  CHECK(num(doc["ceiling"]["queue_depth"]) == 32);
  CHECK(num(doc["ceiling"]["chunk_bytes"]) == 8 << 20);
  const bool uring = std::string_view(doc["backend"]) == "io_uring";
  for (const char* phase : {"sequential", "random"}) {
    CAPTURE(phase);
    simdjson::dom::element c = doc["ceiling"][phase];
    CHECK(num(c["bytes"]) > 0);
    CHECK(num(c["requests"]) > 0);
    CHECK(num(c["bytes"]) <= num(c["requests"]) * num(c["request_bytes"]));
    if (uring) CHECK(num(c["peak_in_flight"]) == 32);
  }
  // The engine's own settings are the shallow ones (reader_options.cpp), measured separately.
  CHECK(num(doc["engine"]["trunk_queue_depth"]) < 32);
  CHECK(num(doc["engine"]["token_pattern"]["bytes"]) > 0);
  CHECK(num(doc["ceiling_gbps"]) > 0);
  CHECK(num(doc["random_gbps"]) > 0);
  CHECK(num(doc["engine_gbps"]) > 0);
  CHECK(num(doc["engine_vs_ceiling"]) == doctest::Approx(num(doc["engine_gbps"]) / num(doc["ceiling_gbps"])));
  // One spinner per hardware thread by default, quiet and beside the reads.
  CHECK(num(doc["cpu"]["threads"]) >= 1);
  for (const char* k : {"share_reading", "share_quiet"}) {
    CAPTURE(k);
    CHECK(num(doc["cpu"][k]) > 0);
    CHECK(num(doc["cpu"][k]) <= 1);
  }
  CHECK(num(doc["cpu"]["reading_gbps"]) > 0);
  CHECK(num(doc["cpu"]["read_share"]) > 0);
  CHECK(num(doc["cpu"]["read_share"]) <= 1);

  // Text: both rates and the last line.
  const k3::test::Run t =
      k3::test::k3flow_sh(fmt::format("probe {} --seconds 0.2 --queue-depth 4 --chunk-kb 256", tiny_model()));
  INFO(t.err);
  REQUIRE(t.code == 0);
  CHECK(t.out.find("device ceiling: ") != std::string::npos);
  CHECK(t.out.find("4 x 256 KiB in flight") != std::string::npos);
  CHECK(t.out.find("reading shards") != std::string::npos);
  CHECK(t.out.find("device probe: ") != std::string::npos);
  CHECK(t.out.find("ceiling_gbps=") != std::string::npos);
  CHECK(t.out.find(" cpu_share_reading=") != std::string::npos);
  CHECK(t.out.find("CPU kept by ") != std::string::npos);
  // --cpu-threads 0 skips the spinners: no line, no field on the last line.
  const k3::test::Run q =
      k3::test::k3flow_sh(fmt::format("probe {} --seconds 0.1 --cpu-threads 0", tiny_model()));
  INFO(q.err);
  REQUIRE(q.code == 0);
  CHECK(q.out.find("CPU kept by ") == std::string::npos);
  CHECK(q.out.find("cpu_share_reading=") == std::string::npos);
}

TEST_CASE("probe refuses bad input with one line naming it, exit 2") {
  TempDir d;
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"probe " + d / "none", "MODEL_DIR"},
      {"probe " + tiny_model() + " --trunk " + d / "none", "--trunk"},
      {"probe " + tiny_model() + " --queue-depth 0", "--queue-depth"},
      {"probe " + tiny_model() + " --chunk-kb 6", "--chunk-kb"},
      {"probe " + tiny_model() + " --seconds 0", "--seconds"},
      {"probe " + tiny_model() + " --bogus", "--bogus"},
  };
  for (const auto& [args_, what] : cases) {
    const auto& args = args_;  // doctest's lambdas need a variable: clang 14 cannot capture a binding
    CAPTURE(args);
    const k3::test::Run r = k3::test::k3flow_sh(args);
    CHECK(r.code == 2);
    CHECK_MESSAGE(r.err.find(what) != std::string::npos, r.err);
    CHECK(r.out.empty());
  }
  // One line for our own refusals (CLI11's parse errors add a usage hint).
  const k3::test::Run r = k3::test::k3flow_sh("probe " + d / "none");
  CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
}
