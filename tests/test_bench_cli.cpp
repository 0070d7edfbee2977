// `k3flow bench` end to end (the binary, K3FLOW_BIN) on a tiny synthetic checkpoint: the JSON it
// writes, the strategies' agreement, the last line, and every refusal with its exit code. The first
// case runs the real engine (all four strategies at a budget below the model's size); the others
// drive the bench with a stand-in `generate` (K3FLOW_BENCH_CHILD) whose report and outputs the
// test controls, so the arithmetic and the refusals are checked exactly.
#include <doctest/doctest.h>
#include <fmt/format.h>
#include <simdjson.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <regex>
#include <string>
#include <vector>

#include "tests/run_helpers.hpp"

namespace fs = std::filesystem;

namespace {

struct Run {
  int code = -1;
  std::string out;  // stdout + stderr
  std::string last_stdout_line;
};

using k3::test::slurp;
using k3::test::TempDir;

std::string last_line(const std::string& text) {
  std::string t = text;
  while (!t.empty() && t.back() == '\n') t.pop_back();
  const size_t nl = t.rfind('\n');
  return nl == std::string::npos ? t : t.substr(nl + 1);
}

// Runs `k3flow ARGS` with ENV prepended; stdout and stderr kept apart for the last-line check.
Run k3flow(const std::string& args, const std::string& env = "") {
  const k3::test::Run c = k3::test::k3flow_sh(args, env);
  Run r;
  r.code = c.code;
  r.last_stdout_line = last_line(c.out);
  r.out = c.out + c.err;
  return r;
}

// One synthetic tiny checkpoint (~7 MB) for the whole file.
const std::string& tiny_model() {
  static TempDir dir;
  static std::string model;
  if (model.empty()) {
    model = dir / "tiny";
    const Run r = k3flow(fmt::format("synth {} --size tiny --seed 3", model));
    REQUIRE_MESSAGE(r.code == 0, r.out);
  }
  return model;
}

struct Json {
  simdjson::dom::parser parser;
  simdjson::dom::element doc;
  explicit Json(const std::string& path) {
    auto e = parser.load(path).get(doc);
    REQUIRE_MESSAGE(e == simdjson::SUCCESS, path);
  }
};

double num(simdjson::dom::element e) {
  double d;
  if (e.get(d) == simdjson::SUCCESS) return d;
  int64_t i;
  if (e.get(i) == simdjson::SUCCESS) return double(i);
  uint64_t u = 0;
  REQUIRE(e.get(u) == simdjson::SUCCESS);
  return double(u);
}

std::string str(simdjson::dom::element e) {
  std::string_view v;
  REQUIRE(e.get(v) == simdjson::SUCCESS);
  return std::string(v);
}

std::vector<int64_t> ints(simdjson::dom::element e) {
  std::vector<int64_t> v;
  for (simdjson::dom::element x : e.get_array()) v.push_back(int64_t(x));
  return v;
}

const std::vector<std::string> kAll = {"serial", "trunk", "overlap", "lookahead", "auto"};
const char* kTopKeys[] = {"model",
                          "budget_bytes",
                          "ceiling_gbps",
                          "ceiling_gbps_samples",
                          "ceiling_random_gbps",
                          "ceiling_random_gbps_samples",
                          "ceiling_queue_depth",
                          "ceiling_chunk_bytes",
                          "engine_probe_gbps",
                          "engine_probe_gbps_samples",
                          "t_cpu_per_token",
                          "strategies",
                          "best",
                          "speedup_vs_serial"};
const char* kStrategyKeys[] = {"strategy",
                               "s_per_token",
                               "s_per_token_min",
                               "bytes_per_token",
                               "trunk_bytes_per_token",
                               "expert_bytes_per_token",
                               "t_io",
                               "t_cpu",
                               "overlap_efficiency",
                               "ceiling_gbps",
                               "effective_read_gbps",
                               "read_vs_ceiling",
                               "io_wait_share",
                               "io_busy_share",
                               "lookahead_hit_rate",
                               "peak_rss_bytes",
                               "ids",
                               "compute_per_token"};
const std::regex kLastLine(R"(best=(serial|trunk|overlap|lookahead|auto) overlap_efficiency=[0-9]+\.[0-9]+ )"
                           R"(speedup_vs_serial=[0-9]+\.[0-9]+)");

void check_keys(const Json& j) {
  for (const char* k : kTopKeys) CHECK_MESSAGE(j.doc[k].error() == simdjson::SUCCESS, k);
  for (simdjson::dom::element s : j.doc["strategies"].get_array())
    for (const char* k : kStrategyKeys) CHECK_MESSAGE(s[k].error() == simdjson::SUCCESS, k);
}

// A stand-in for `k3flow generate`: the streaming engine's full report, with per-strategy step-1
// wall times serial 0.4, trunk 0.3, overlap 0.2, lookahead 0.25 s (resident 0.1) and a step 0 far
// slower, so using it would show; FAKE_RING_WALL replaces the step-1 time of a run given --ring.
// FAKE_FAIL / FAKE_BAD_IDS / FAKE_BAD_LOGITS / FAKE_WRONG_STRATEGY
// name a strategy to misbehave; every call is logged to FAKE_LOG.
const char* kFakeGenerate = R"FAKE(#!/bin/bash
[ "$1" = generate ] || { echo "fake: expected generate, got $1" >&2; exit 9; }
shift
if [ "$1" = --help ]; then
  printf 'Options:\n  --ids TEXT\n  --gen INT\n  --incremental\n  --out TEXT\n  --dump-logits TEXT\n'
  printf '  --strategy TEXT\n  --mem-gb FLOAT\n  --threads INT\n  --ring INT\n'
  exit 0
fi
out=; logits=; st=resident; mem=; ring=
while [ $# -gt 0 ]; do
  case "$1" in
    --out) out=$2; shift;;
    --dump-logits) logits=$2; shift;;
    --strategy) st=$2; shift;;
    --mem-gb) mem=$2; shift;;
    --ring) echo "$st $2" >> "$FAKE_LOG.ring"; ring=$2; shift;;
  esac
  shift
done
echo "$st $mem" >> "$FAKE_LOG"
if [ "$st" = "$FAKE_FAIL" ]; then echo "STEP TOKEN"; echo "k3flow: $st ran out of expert slots" >&2; exit 1; fi
case $st in serial) w=0.4;; trunk) w=0.3;; overlap) w=0.2;; lookahead) w=0.25;; auto) w=0.22;; *) w=0.1;; esac
[ -n "$ring" ] && [ -n "$FAKE_RING_WALL" ] && w=$FAKE_RING_WALL
ids="7,8"; [ "$st" = "$FAKE_BAD_IDS" ] && ids="7,9"
said=$st; [ "$st" = "$FAKE_WRONG_STRATEGY" ] && said=serial
printf 'LOGITS' > "$logits"; [ "$st" = "$FAKE_BAD_LOGITS" ] && printf 'LOGITX' > "$logits"
pred=0; used=0; [ "$st" = lookahead ] && { pred=10; used=7; }
cat > "$out" <<JSON
{"prompt_ids":[1,2],"generated_ids":[$ids],"full_ids":[1,2,$ids],"layers":4,"seconds_per_token":9.9,"peak_rss_bytes":123456789,"strategy":"$said","threads":0,"budget_bytes":0,"trunk_bytes_read":7000000000,"expert_bytes_read":6000000000,"expert_requests":20,"expert_hits":5,"lookahead_predicted":$pred,"lookahead_used":$used,"uring_bytes":0,"pread_bytes":0,"io_busy_seconds":1,"compute_busy_seconds":1,"wall_seconds":2,"overlap_efficiency":0.5,"tokens":[{"step":0,"token":7,"wall_seconds":5.0,"io_wait_seconds":1,"compute_seconds":2.0,"trunk_bytes":5000000000,"expert_bytes":5000000000},{"step":1,"token":8,"wall_seconds":$w,"io_wait_seconds":0.1,"compute_seconds":0.1,"trunk_bytes":2000000000,"expert_bytes":1000000000}]}
JSON
)FAKE";

struct Fake {
  TempDir dir;
  std::string exe = dir / "fake-k3flow";
  std::string log = dir / "calls.log";
  Fake() {
    std::ofstream(exe) << kFakeGenerate;
    REQUIRE(::chmod(exe.c_str(), 0755) == 0);
  }
  std::string env(const std::string& extra = "") const {
    return fmt::format("K3FLOW_BENCH_CHILD={} FAKE_LOG={} {}", exe, log, extra);
  }
};

}  // namespace

TEST_CASE("bench on a tiny synthetic checkpoint: every strategy, same ids, JSON keys, last line") {
  TempDir d;
  // 5 MiB: below the checkpoint's 6.8 MB, above its plan floor, so every strategy streams.
  const Run r = k3flow(fmt::format("bench {} --mem-gb 0.005 --gen 2 --repeat 1 --probe-seconds 0.2 --out {}",
                                   tiny_model(), d / "bench.json"));
  INFO(r.out);
  REQUIRE(r.code == 0);
  CHECK(std::regex_match(r.last_stdout_line, kLastLine));
  CHECK(r.out.find("step 0, the prefill, excluded") != std::string::npos);
  Json j(d / "bench.json");
  check_keys(j);
  CHECK(num(j.doc["budget_bytes"]) == double(std::llround(0.005 * double(1 << 30))));
  CHECK(num(j.doc["ceiling_gbps"]) > 0);
  CHECK(num(j.doc["ceiling_random_gbps"]) > 0);
  CHECK(num(j.doc["engine_probe_gbps"]) > 0);
  CHECK(num(j.doc["ceiling_queue_depth"]) == 32);  // the ceiling's deep queue, not the engine's 4
  CHECK(num(j.doc["ceiling_chunk_bytes"]) == 8 << 20);
  CHECK(num(j.doc["t_cpu_per_token"]) > 0);  // 7 MB fits: measured resident
  std::vector<std::string> names;
  std::vector<int64_t> first_ids;
  for (simdjson::dom::element s : j.doc["strategies"].get_array()) {
    names.push_back(str(s["strategy"]));
    const std::vector<int64_t> ids = ints(s["ids"]);
    CHECK(ids.size() == 2);
    if (first_ids.empty()) first_ids = ids;
    CHECK(ids == first_ids);
    CHECK(num(s["s_per_token"]) > 0);
    CHECK(num(s["s_per_token_min"]) <= num(s["s_per_token"]));
    CHECK(num(s["peak_rss_bytes"]) > 0);
  }
  CHECK(names == kAll);
  const std::string best = str(j.doc["best"]);
  CHECK(std::find(kAll.begin(), kAll.end(), best) != kAll.end());
  CHECK(num(j.doc["speedup_vs_serial"]) > 0);

  // What only the streaming engine can satisfy: it takes --strategy / --mem-gb and reads weights.
  CHECK_MESSAGE(j.doc["child_missing_flags"].get_array().size() == 0,
                "k3flow generate lacks --strategy / --mem-gb: the streaming engine has not landed");
  for (simdjson::dom::element s : j.doc["strategies"].get_array()) {
    const std::string name = str(s["strategy"]);
    CAPTURE(name);
    CHECK(num(s["bytes_per_token"]) > 0);
    CHECK(num(s["t_io"]) > 0);
    // the engine's own read rate against the ceiling for its byte mix
    CHECK(num(s["effective_read_gbps"]) > 0);
    CHECK(num(s["ceiling_gbps"]) > 0);
    CHECK(num(s["read_vs_ceiling"]) ==
          doctest::Approx(num(s["effective_read_gbps"]) / num(s["ceiling_gbps"])));
    CHECK(num(s["trunk_bytes_per_token"]) + num(s["expert_bytes_per_token"]) ==
          doctest::Approx(num(s["bytes_per_token"])));
  }
}

TEST_CASE("stand-in engine: prefill excluded, medians, T_io / T_cpu / overlap arithmetic, best, speedup") {
  Fake f;
  TempDir d;
  const Run r = k3flow(fmt::format("bench {} --mem-gb 0.005 --gen 2 --repeat 2 --probe-seconds 0.1 --out {}",
                                   tiny_model(), d / "bench.json"),
                       f.env());
  INFO(r.out);
  REQUIRE(r.code == 0);
  Json j(d / "bench.json");
  check_keys(j);
  CHECK(j.doc["child_missing_flags"].get_array().size() == 0);
  const double seq = num(j.doc["ceiling_gbps"]), rnd = num(j.doc["ceiling_random_gbps"]);
  REQUIRE(seq > 0);
  REQUIRE(rnd > 0);
  // One ceiling probe per round; T_io prices trunk bytes with the sequential median (of 2: the mean),
  // expert bytes with the random one.
  std::vector<double> probes, random_probes, engine;
  for (simdjson::dom::element g : j.doc["ceiling_gbps_samples"].get_array()) probes.push_back(num(g));
  for (simdjson::dom::element g : j.doc["ceiling_random_gbps_samples"].get_array())
    random_probes.push_back(num(g));
  for (simdjson::dom::element g : j.doc["engine_probe_gbps_samples"].get_array()) engine.push_back(num(g));
  REQUIRE(probes.size() == 2);
  REQUIRE(random_probes.size() == 2);
  REQUIRE(engine.size() == 2);
  CHECK(seq == doctest::Approx((probes[0] + probes[1]) / 2));
  CHECK(rnd == doctest::Approx((random_probes[0] + random_probes[1]) / 2));
  CHECK(num(j.doc["engine_probe_gbps"]) == doctest::Approx((engine[0] + engine[1]) / 2));
  CHECK(r.out.find("[2/2] probe      ceiling ") != std::string::npos);
  CHECK(num(j.doc["t_cpu_per_token"]) == doctest::Approx(0.1));  // resident step 1 compute
  const std::map<std::string, double> wall = {
      {"serial", 0.4}, {"trunk", 0.3}, {"overlap", 0.2}, {"lookahead", 0.25}, {"auto", 0.22}};
  for (simdjson::dom::element s : j.doc["strategies"].get_array()) {
    const std::string name = str(s["strategy"]);
    CAPTURE(name);
    CHECK(num(s["s_per_token"]) == doctest::Approx(wall.at(name)));  // step 0 (5 s) not counted
    CHECK(num(s["s_per_token_min"]) == doctest::Approx(wall.at(name)));
    CHECK(s["s_per_token_runs"].get_array().size() == 2);
    CHECK(num(s["bytes_per_token"]) == doctest::Approx(3e9));  // step 1 only
    CHECK(num(s["trunk_bytes_per_token"]) == doctest::Approx(2e9));
    CHECK(num(s["expert_bytes_per_token"]) == doctest::Approx(1e9));
    const double t_io = 2e9 / (seq * 1e9) + 1e9 / (rnd * 1e9);
    CHECK(num(s["t_io"]) == doctest::Approx(t_io));
    CHECK(num(s["ceiling_gbps"]) == doctest::Approx(3e9 / t_io / 1e9));  // the ceiling for this mix
    // the whole run: 13 GB read with a read in flight for 1 s of its 2
    CHECK(num(s["effective_read_gbps"]) == doctest::Approx(13.0));
    CHECK(num(s["read_vs_ceiling"]) == doctest::Approx(13.0 / num(s["ceiling_gbps"])));
    CHECK(num(s["io_busy_share"]) == doctest::Approx(0.5));
    CHECK(num(s["io_wait_share"]) == doctest::Approx(0.1 / wall.at(name)));  // step 1 waited 0.1 s
    CHECK(num(s["t_cpu"]) == doctest::Approx(0.1));
    CHECK(num(s["compute_per_token"]) == doctest::Approx(0.1));  // the stand-in's step 1 compute
    CHECK(num(s["overlap_efficiency"]) == doctest::Approx(std::max(t_io, 0.1) / wall.at(name)));
    CHECK(num(s["report_peak_rss_bytes"]) == 123456789);
    CHECK(num(s["peak_rss_bytes"]) > 0);  // the stand-in's own, from wait4
    CHECK(ints(s["ids"]) == std::vector<int64_t>{7, 8});
    if (name == "lookahead")
      CHECK(num(s["lookahead_hit_rate"]) == doctest::Approx(0.7));
    else
      CHECK(s["lookahead_hit_rate"].is_null());
  }
  CHECK(str(j.doc["best"]) == "overlap");
  CHECK(num(j.doc["speedup_vs_serial"]) == doctest::Approx(2.0));
  CHECK(std::regex_match(r.last_stdout_line, kLastLine));
  CHECK(r.last_stdout_line.starts_with("best=overlap overlap_efficiency="));
  CHECK(r.last_stdout_line.ends_with(" speedup_vs_serial=2.000"));
  // 2 rounds of: the resident run, then the 5 strategies, each with the budget as given.
  CHECK(slurp(f.log) ==
        "resident \nserial 0.005\ntrunk 0.005\noverlap 0.005\nlookahead 0.005\nauto 0.005\n"
        "resident \nserial 0.005\ntrunk 0.005\noverlap 0.005\nlookahead 0.005\nauto 0.005\n");
}

TEST_CASE("--strategy picks a subset in the order given; without serial the speedup is n/a") {
  Fake f;
  TempDir d;
  const Run r = k3flow(fmt::format("bench {} --mem-gb 0.005 --gen 2 --repeat 1 --probe-seconds 0.1 "
                                   "--strategy lookahead,trunk --out {}",
                                   tiny_model(), d / "bench.json"),
                       f.env());
  INFO(r.out);
  REQUIRE(r.code == 0);
  Json j(d / "bench.json");
  std::vector<std::string> names;
  for (simdjson::dom::element s : j.doc["strategies"].get_array()) names.push_back(str(s["strategy"]));
  CHECK(names == std::vector<std::string>{"lookahead", "trunk"});
  CHECK(j.doc["speedup_vs_serial"].is_null());
  CHECK(r.last_stdout_line.starts_with("best=lookahead overlap_efficiency="));
  CHECK(r.last_stdout_line.ends_with(" speedup_vs_serial=n/a"));
}

TEST_CASE("--ring N reaches every streamed run, not the resident one, and the bench's own plan") {
  Fake f;
  const std::string args = fmt::format(
      "bench {} --mem-gb 0.005 --gen 2 --repeat 1 --probe-seconds 0.1 --strategy overlap,auto", tiny_model());
  Run r = k3flow(args + " --ring 3", f.env());
  INFO(r.out);
  REQUIRE(r.code == 0);
  CHECK(slurp(f.log) == "resident \noverlap 0.005\nauto 0.005\n");
  CHECK(slurp(f.log + ".ring") == "overlap 3\nauto 3\n");
  // The default passes nothing, so an engine without the flag still benches.
  fs::remove(f.log + ".ring");
  r = k3flow(args, f.env());
  REQUIRE(r.code == 0);
  CHECK(!fs::exists(f.log + ".ring"));
  // The bench plans with the ring it asks for: a third slot, a higher floor.
  auto floor_of = [](const std::string& text) {
    const size_t at = text.find("plan floor ");
    return at == std::string::npos ? std::string() : text.substr(at, text.find(')', at) - at);
  };
  const Run three = k3flow(args + " --ring 3", f.env());
  REQUIRE(three.code == 0);
  CHECK(!floor_of(r.out).empty());
  CHECK(floor_of(three.out) != floor_of(r.out));
}

TEST_CASE("--ring 2,3 runs every strategy at each depth and names the fastest row's flags") {
  Fake f;
  TempDir d;
  const Run r =
      k3flow(fmt::format("bench {} --mem-gb 0.005 --gen 2 --repeat 1 --probe-seconds 0.1 --strategy "
                         "overlap,auto --ring 2,3 --out {}",
                         tiny_model(), d / "bench.json"),
             f.env("FAKE_RING_WALL=0.15"));
  INFO(r.out);
  REQUIRE(r.code == 0);
  CHECK(r.out.find("strategies overlap,auto, each at ring 2,3") != std::string::npos);
  // Ring 2 is the engine's default and is not passed; ring 3 is, to the ring-3 rows only.
  CHECK(slurp(f.log) == "resident \noverlap 0.005\noverlap 0.005\nauto 0.005\nauto 0.005\n");
  CHECK(slurp(f.log + ".ring") == "overlap 3\nauto 3\n");
  const Json j(d / "bench.json");
  std::vector<std::pair<std::string, int64_t>> rows;
  for (simdjson::dom::element s : j.doc["strategies"].get_array())
    rows.emplace_back(str(s["strategy"]), int64_t(s["ring"]));
  CHECK(rows == std::vector<std::pair<std::string, int64_t>>{
                    {"overlap@ring2", 2}, {"overlap@ring3", 3}, {"auto@ring2", 2}, {"auto@ring3", 3}});
  // The stand-in's ring-3 runs are faster (0.15 s against 0.2 and 0.22): the first of them wins.
  CHECK(str(j.doc["best"]) == "overlap@ring3");
  CHECK(r.last_stdout_line.starts_with("best=overlap@ring3 overlap_efficiency="));
  CHECK(r.out.find("fastest here: k3flow generate " + tiny_model() +
                   " --mem-gb 0.005 --strategy overlap --ring 3\n") != std::string::npos);
}

TEST_CASE("--json prints the JSON document alone on stdout, the text on stderr; --out writes the same") {
  Fake f;
  TempDir d;
  const k3::test::Run r = k3::test::k3flow_sh(
      fmt::format(
          "bench {} --mem-gb 0.005 --gen 2 --repeat 1 --probe-seconds 0.1 --strategy serial,overlap --json "
          "--out {}",
          tiny_model(), d / "bench.json"),
      f.env());
  INFO(r.out, r.err);
  REQUIRE(r.code == 0);
  simdjson::dom::parser parser;
  simdjson::dom::element doc;
  REQUIRE(parser.parse(r.out).get(doc) == simdjson::SUCCESS);  // stdout: nothing but the object
  CHECK(std::count(r.out.begin(), r.out.end(), '\n') == 1);
  CHECK(doc["strategies"].get_array().size() == 2);
  CHECK(str(doc["best"]) == "overlap");
  CHECK(r.err.find("best=overlap overlap_efficiency=") != std::string::npos);  // the text, on stderr
  CHECK(r.err.find("device ceiling") != std::string::npos);
  CHECK(slurp(d / "bench.json") == r.out);
}

TEST_CASE("a strategy that differs in ids, logits or reported strategy fails the bench (exit 1) by name") {
  Fake f;
  TempDir d;
  const std::string args =
      fmt::format("bench {} --mem-gb 0.005 --gen 2 --repeat 1 --probe-seconds 0.1 --out {}", tiny_model(),
                  d / "bench.json");
  Run r = k3flow(args, f.env("FAKE_BAD_LOGITS=overlap"));
  CHECK_MESSAGE(r.code == 1, r.out);
  CHECK_MESSAGE(r.out.find("strategy 'overlap'") != std::string::npos, r.out);
  CHECK_MESSAGE(r.out.find("logits are not byte-identical") != std::string::npos, r.out);
  CHECK(!fs::exists(d / "bench.json"));
  r = k3flow(args, f.env("FAKE_BAD_IDS=trunk"));
  CHECK_MESSAGE(r.code == 1, r.out);
  CHECK_MESSAGE(r.out.find("strategy 'trunk'") != std::string::npos, r.out);
  CHECK_MESSAGE(r.out.find("different ids") != std::string::npos, r.out);
  CHECK(!fs::exists(d / "bench.json"));
  // A run that says it ran another strategy than asked (the flag ignored) is not a comparison.
  r = k3flow(args, f.env("FAKE_WRONG_STRATEGY=lookahead"));
  CHECK_MESSAGE(r.code == 1, r.out);
  CHECK_MESSAGE(
      r.out.find("strategy 'lookahead' (repeat 1): the run reports strategy 'serial'") != std::string::npos,
      r.out);
  CHECK(!fs::exists(d / "bench.json"));
}

TEST_CASE("a failing child fails the bench (exit 1) with the child's own error line") {
  Fake f;
  TempDir d;
  Run r = k3flow(fmt::format("bench {} --mem-gb 0.005 --gen 2 --repeat 1 --probe-seconds 0.1 --out {}",
                             tiny_model(), d / "bench.json"),
                 f.env("FAKE_FAIL=lookahead"));
  CHECK_MESSAGE(r.code == 1, r.out);
  CHECK_MESSAGE(r.out.find("lookahead ran out of expert slots") != std::string::npos, r.out);
  CHECK(!fs::exists(d / "bench.json"));

  // The real engine refusing the run: a prompt longer than generate allows.
  std::string ids = "1";
  for (int i = 1; i < 36864; ++i) ids += ",1";
  r = k3flow(fmt::format("bench {} --mem-gb 1 --gen 2 --repeat 1 --probe-seconds 0.05 --ids {} --out {}",
                         tiny_model(), ids, d / "bench.json"));
  CHECK(r.code == 1);
  CHECK_MESSAGE(r.out.find("k3flow generate failed") != std::string::npos, r.out.substr(0, 2000));
  CHECK_MESSAGE(r.out.find("exceeds") != std::string::npos, r.out.substr(0, 2000));
  CHECK(!fs::exists(d / "bench.json"));
}

TEST_CASE("--trunk-b: raw and exp4 trunks alternate in one bench, same bits, stored and decoded bytes") {
  TempDir d;
  const std::string raw = d / "raw", exp4 = d / "exp4";
  REQUIRE(k3flow(fmt::format("pack-trunk {} {} --no-progress", tiny_model(), raw)).code == 0);
  REQUIRE(k3flow(fmt::format("pack-trunk {} {} --codec exp4 --no-progress", tiny_model(), exp4)).code == 0);
  const Run r =
      k3flow(fmt::format("bench {} --trunk {} --trunk-b {} --mem-gb 0.005 --strategy serial,auto --gen 2 "
                         "--repeat 2 --probe-seconds 0.1 --out {}",
                         tiny_model(), raw, exp4, d / "bench.json"));
  INFO(r.out);
  REQUIRE(r.code == 0);
  CHECK(r.out.find("trunk A (" + raw + ") vs trunk B (" + exp4 + ")") != std::string::npos);
  Json j(d / "bench.json");
  std::vector<std::string> names;
  for (simdjson::dom::element s : j.doc["strategies"].get_array()) {
    const std::string name = str(s["strategy"]);
    names.push_back(name);
    CAPTURE(name);
    const bool compressed = name.ends_with("@exp4");
    CHECK(str(s["codec"]) == (compressed ? "exp4" : "none"));
    CHECK((num(s["decoded_bytes_per_token"]) > 0) == compressed);
    CHECK((num(s["decode_seconds_per_token"]) > 0) == compressed);
    CHECK(num(s["s_per_token"]) > 0);
  }
  CHECK(names == std::vector<std::string>{"serial@none", "serial@exp4", "auto@none", "auto@exp4"});
  // (which trunk reads fewer bytes here depends on the plan: the compressed floor holds a decoded slot
  // too, so at this tiny budget it pins fewer layers -- docs/codec.md, "The decode stage")
  // With two ring depths the pairs stay pairs: <strategy>@ring<N>@<codec>, compared per depth.
  const Run rings = k3flow(
      fmt::format("bench {} --trunk {} --trunk-b {} --mem-gb 0.005 --strategy overlap --ring 2,3 --gen 2 "
                  "--repeat 1 --probe-seconds 0.1 --out {}",
                  tiny_model(), raw, exp4, d / "rings.json"));
  INFO(rings.out);
  REQUIRE(rings.code == 0);
  names.clear();
  const Json jr(d / "rings.json");
  for (simdjson::dom::element s : jr.doc["strategies"].get_array()) names.push_back(str(s["strategy"]));
  CHECK(names == std::vector<std::string>{"overlap@ring2@none", "overlap@ring2@exp4", "overlap@ring3@none",
                                          "overlap@ring3@exp4"});
  CHECK(rings.out.find("\n  overlap@ring2 s/token ") != std::string::npos);
  CHECK(rings.out.find("\n  overlap@ring3 s/token ") != std::string::npos);
  CHECK(rings.out.find(" --trunk ") != std::string::npos);  // the fastest row's flags name its trunk
  // --trunk-b alone is a usage error
  const Run bad = k3flow(fmt::format("bench {} --trunk-b {} --mem-gb 0.008", tiny_model(), exp4));
  CHECK(bad.code == 2);
  CHECK(bad.out.find("--trunk-b") != std::string::npos);
}

TEST_CASE("bad flags exit 2 naming the flag, before any run and without output files") {
  Fake f;
  TempDir d;
  const std::string m = tiny_model(), json = " --out " + d / "bench.json";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"bench " + m + " --mem-gb 1 --bogus", "--bogus"},
      {"bench " + m + " --mem-gb 1 --strategy serial,warp", "warp"},
      {"bench " + m + " --mem-gb 1 --strategy serial,serial", "serial"},
      {"bench " + m + " --mem-gb 1 --strategy serial,", "--strategy"},
      {"bench " + m + " --mem-gb 1 --repeat 0", "--repeat"},
      {"bench " + m + " --mem-gb 1 --gen 0", "--gen"},
      {"bench " + m + " --mem-gb 1 --gen 1", "--gen"},  // no decode step after the prefill to time
      {"bench " + m + " --mem-gb 1 --strategies serial", "--strategies"},  // renamed --strategy
      {"bench " + m + " --mem-gb 1 --gen two", "--gen"},
      {"bench " + m, "--mem-gb"},
      {"bench " + m + " --mem-gb 1 --preset laptop", "--preset"},
      {"bench " + m + " --mem-gb 0", "--mem-gb"},
      {"bench " + m + " --mem-gb 0.000001", "--mem-gb"},  // below the plan's floor
      {"bench " + m + " --preset palmtop", "--preset"},
      {"bench " + m + " --mem-gb 1 --ids 1,x", "--ids"},
      {"bench " + m + " --mem-gb 1 --ids 99999", "--ids"},
      {"bench " + m + " --mem-gb 1 --threads -1", "--threads"},
      {"bench " + m + " --mem-gb 1 --ring 1", "--ring"},
      {"bench " + m + " --mem-gb 1 --ring 65", "--ring"},
      {"bench " + m + " --mem-gb 1 --ring 2,2", "--ring"},
      {"bench " + m + " --mem-gb 1 --ring 2,x", "--ring"},
      {"bench " + m + " --mem-gb 1 --ring ,", "--ring"},
      {"bench " + m + " --mem-gb 1 --batch 1,2 --ring 3", "--ring"},
      {"bench " + m + " --mem-gb 1 --probe-seconds 0", "--probe-seconds"},
      {"bench " + d / "no-such-model" + " --mem-gb 1", "MODEL_DIR"},
  };
  for (const auto& [args_, flag] : cases) {
    const auto& args = args_;  // doctest's lambdas need a variable: clang 14 cannot capture a binding
    CAPTURE(args);
    const Run r = k3flow(args + json, f.env());
    CHECK_MESSAGE(r.code == 2, r.out);
    CHECK_MESSAGE(r.out.find(flag) != std::string::npos, r.out);
    CHECK(!fs::exists(d / "bench.json"));
  }
  for (const std::string& out : {d / "no-such-dir/b.json", d.path.string()}) {
    CAPTURE(out);
    const Run r = k3flow("bench " + m + " --mem-gb 1 --out " + out, f.env());
    CHECK_MESSAGE(r.code == 2, r.out);
    CHECK_MESSAGE(r.out.find("--out") != std::string::npos, r.out);
  }
  CHECK(!fs::exists(f.log));  // no child generate ran
  // --trace-dir needs a generate that takes --trace (the stand-in does not).
  const Run r = k3flow("bench " + m + " --mem-gb 1 --trace-dir " + d / "traces" + json, f.env());
  CHECK_MESSAGE(r.code == 2, r.out);
  CHECK(r.out.find("--trace-dir") != std::string::npos);
}
