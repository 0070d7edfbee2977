// perf/plot_bench.py: a bench JSON becomes a PNG (signature, IHDR size), a malformed one is refused
// with exit 2 and one line naming the file, and no PNG is left behind. Runs Debian's python3 (the
// one python3-matplotlib installs into) when present.
#include <doctest/doctest.h>
#include <fmt/format.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "tests/run_helpers.hpp"

namespace fs = std::filesystem;

namespace {

using k3::test::Run;
using k3::test::slurp;
using k3::test::TempDir;

// `python3 perf/plot_bench.py ARGS` (shell words); the tests read the exit code and stderr.
Run plot(const std::string& args) {
  const char* python = fs::exists("/usr/bin/python3") ? "/usr/bin/python3" : "python3";
  return k3::test::shell(fmt::format("{} {}/perf/plot_bench.py {}", python, K3_SOURCE_DIR, args));
}

uint32_t be32(const std::string& s, size_t at) {
  return uint32_t(uint8_t(s[at])) << 24 | uint32_t(uint8_t(s[at + 1])) << 16 |
         uint32_t(uint8_t(s[at + 2])) << 8 | uint32_t(uint8_t(s[at + 3]));
}

// What `k3flow bench --out FILE` writes (the fields the chart reads, and a few it ignores).
const char* kBench = R"({"model":"out/k3-synth-small","budget_bytes":268435456,"ceiling_gbps":2.1,
"t_cpu_per_token":0.05,"strategies":[
{"strategy":"serial","s_per_token":0.21,"s_per_token_min":0.2,"bytes_per_token":3.2e8,"t_io":0.152,"t_cpu":0.05,"overlap_efficiency":0.724,"lookahead_hit_rate":null,"peak_rss_bytes":250000000,"ids":[1,2]},
{"strategy":"trunk","s_per_token":0.17,"s_per_token_min":0.16,"bytes_per_token":3.2e8,"t_io":0.152,"t_cpu":0.05,"overlap_efficiency":0.894,"lookahead_hit_rate":null,"peak_rss_bytes":250000000,"ids":[1,2]},
{"strategy":"overlap","s_per_token":0.158,"s_per_token_min":0.155,"bytes_per_token":3.2e8,"t_io":0.152,"t_cpu":0.05,"overlap_efficiency":0.962,"lookahead_hit_rate":null,"peak_rss_bytes":250000000,"ids":[1,2]},
{"strategy":"lookahead","s_per_token":0.16,"s_per_token_min":0.154,"bytes_per_token":3.3e8,"t_io":0.157,"t_cpu":0.05,"overlap_efficiency":0.981,"lookahead_hit_rate":0.8,"peak_rss_bytes":250000000,"ids":[1,2]}],
"best":"overlap","speedup_vs_serial":1.329})";

}  // namespace

TEST_CASE("plot_bench.py: bench JSON -> a PNG chart") {
  TempDir d;
  std::ofstream(d / "bench.json") << kBench;
  const Run r = plot(d / "bench.json " + d / "bench.png");
  REQUIRE_MESSAGE(r.code == 0, r.err);
  const std::string png = slurp(d / "bench.png");
  REQUIRE(png.size() > 33);
  CHECK(png.compare(0, 8, std::string("\x89PNG\r\n\x1a\n", 8)) == 0);
  CHECK(png.compare(12, 4, "IHDR") == 0);
  CHECK(be32(png, 16) >= 400);  // width
  CHECK(be32(png, 20) >= 300);  // height
  CHECK(!fs::exists(d / "bench.png.partial"));
}

TEST_CASE("plot_bench.py: malformed JSON and bad usage exit 2 with one line, no PNG") {
  TempDir d;
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"{\"strategies\": [", "not JSON"},
      {"[1, 2]", "not a JSON object"},
      {"{\"model\": \"m\"}", "\"strategies\""},
      {"{\"strategies\": []}", "\"strategies\""},
      {"{\"strategies\": [{\"strategy\": \"serial\", \"s_per_token\": \"fast\", \"t_io\": 0, \"t_cpu\": 0, "
       "\"overlap_efficiency\": 0}]}",
       "s_per_token"},
      {"{\"strategies\": [{\"s_per_token\": 1, \"t_io\": 0, \"t_cpu\": 0, \"overlap_efficiency\": 0}]}",
       "\"strategy\""},
      {"{\"strategies\": [{\"strategy\": \"serial\", \"s_per_token\": 1, \"t_cpu\": 0, "
       "\"overlap_efficiency\": 0}]}",
       "t_io"},
  };
  for (const auto& [json_, what] : cases) {
    const auto& json = json_;  // doctest's lambdas need a variable: clang 14 cannot capture a binding
    CAPTURE(json);
    std::ofstream(d / "bad.json", std::ios::trunc) << json;
    const Run r = plot(d / "bad.json " + d / "bad.png");
    CHECK(r.code == 2);
    CHECK_MESSAGE(r.err.find(d / "bad.json") != std::string::npos, r.err);
    CHECK_MESSAGE(r.err.find(what) != std::string::npos, r.err);
    CHECK(!fs::exists(d / "bad.png"));
  }
  const Run missing = plot(d / "absent.json " + d / "x.png");
  CHECK(missing.code == 2);
  CHECK(missing.err.find("absent.json") != std::string::npos);
  const Run usage = plot(d / "bad.json");
  CHECK(usage.code == 2);
  CHECK(usage.err.find("usage") != std::string::npos);
}
