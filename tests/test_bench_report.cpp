// pipeline/bench/bench_report.*: reading the child's k3_run.json (old and new shapes), the STEP table
// fallback, the per-run reduction (prefill excluded), the per-strategy arithmetic, ranking, the
// JSON (parsed back) and the last line.
#include <doctest/doctest.h>
#include <simdjson.h>

#include <string>

#include "io/error.hpp"
#include "pipeline/bench/bench_report.hpp"

using namespace k3::pipeline;

namespace {

// Today's resident generate: the six reference fields plus a few, none of the streaming ones.
const char* kOld =
    R"({"prompt_ids":[1,2,3],"generated_ids":[9,553],"full_ids":[1,2,3,9,553],"layers":4,"threads":0,)"
    R"("incremental":true,"peak_rss_bytes":13983744,"wall_seconds":0.0349,"seconds_per_token":0.0018})";

const char* kNew =
    R"({"prompt_ids":[1],"generated_ids":[4,5,6],"full_ids":[1,4,5,6],"layers":4,"seconds_per_token":0.5,)"
    R"("peak_rss_bytes":1000,"strategy":"lookahead","threads":2,"budget_bytes":5368709,)"
    R"("trunk_bytes_read":900,"expert_bytes_read":300,"expert_requests":40,"expert_hits":10,)"
    R"("lookahead_predicted":8,"lookahead_used":6,"uring_bytes":1200,"pread_bytes":0,)"
    R"("io_busy_seconds":0.7,"compute_busy_seconds":0.6,"wall_seconds":1.5,"overlap_efficiency":0.4,)"
    R"("tokens":[{"step":0,"token":4,"wall_seconds":1.0,"io_wait_seconds":0.5,"compute_seconds":0.4,)"
    R"("trunk_bytes":500,"expert_bytes":200},)"
    R"({"step":1,"token":5,"wall_seconds":0.2,"io_wait_seconds":0.1,"compute_seconds":0.1,"trunk_bytes":200,)"
    R"("expert_bytes":40},)"
    R"({"step":2,"token":6,"wall_seconds":0.3,"io_wait_seconds":0.1,"compute_seconds":0.1,"trunk_bytes":200,)"
    R"("expert_bytes":60}]})";

const char* kStdout = R"(config: x
STEP   TOKEN      SECONDS      TOK/S
----------------------------------------
wrote /tmp/l.bin (1024 float32 logits)
0      9          0.0058       171.70
1      553        0.0007       1443.01
2      732        0.0005       2236.08
----------------------------------------
3 tokens in 0.007 s, 0.0023 s/token average
)";

}  // namespace

TEST_CASE("the resident report parses; streaming fields read as 0") {
  const ChildReport r = parse_child_report(kOld, "old");
  CHECK(r.generated_ids == std::vector<int32_t>{9, 553});
  CHECK(r.full_ids.size() == 5);
  CHECK(r.peak_rss_bytes == 13983744);
  CHECK(r.seconds_per_token == doctest::Approx(0.0018));
  CHECK(r.strategy.empty());
  CHECK(r.trunk_bytes_read == 0);
  CHECK(r.lookahead_predicted == 0);
  CHECK(r.tokens.empty());
}

TEST_CASE("the streaming report parses every named field") {
  const ChildReport r = parse_child_report(kNew, "new");
  CHECK(r.strategy == "lookahead");
  CHECK(r.threads == 2);
  CHECK(r.budget_bytes == 5368709);
  CHECK(r.trunk_bytes_read == 900);
  CHECK(r.expert_bytes_read == 300);
  CHECK(r.expert_requests == 40);
  CHECK(r.expert_hits == 10);
  CHECK(r.lookahead_predicted == 8);
  CHECK(r.lookahead_used == 6);
  CHECK(r.uring_bytes == 1200);
  CHECK(r.io_busy_seconds == doctest::Approx(0.7));
  CHECK(r.compute_busy_seconds == doctest::Approx(0.6));
  CHECK(r.overlap_efficiency == doctest::Approx(0.4));
  REQUIRE(r.tokens.size() == 3);
  CHECK(r.tokens[2].step == 2);
  CHECK(r.tokens[2].token == 6);
  CHECK(r.tokens[2].expert_bytes == 60);
  CHECK(r.tokens[1].compute_seconds == doctest::Approx(0.1));
}

TEST_CASE("a malformed report is a runtime error naming its source") {
  for (const char* bad : {"", "{\"generated_ids\":[1,", "[1,2]", R"({"generated_ids":"1,2"})",
                          R"({"peak_rss_bytes":"big"})", R"({"tokens":{"step":0}})", R"({"tokens":[1]})"}) {
    CAPTURE(bad);
    try {
      parse_child_report(bad, "serial run report");
      FAIL("accepted");
    } catch (const k3::io::Error& e) {
      CHECK(e.kind() == k3::io::ErrorKind::runtime);
      CHECK(std::string(e.what()).find("serial run report") != std::string::npos);
    }
  }
}

TEST_CASE("the STEP table: rows after the header, 'wrote' lines skipped, stops at the closing rule") {
  const std::vector<StepRow> rows = parse_step_table(kStdout);
  REQUIRE(rows.size() == 3);
  CHECK(rows[0].step == 0);
  CHECK(rows[0].token == 9);
  CHECK(rows[0].wall_seconds == doctest::Approx(0.0058));
  CHECK(rows[2].wall_seconds == doctest::Approx(0.0005));
  CHECK(parse_step_table("no table here\n").empty());
}

TEST_CASE("summarize_run: steps after the prefill, from the report's tokens when present") {
  const RunSample s = summarize_run(parse_child_report(kNew, "new"), {}, 3, 4096);
  CHECK(s.ids == std::vector<int32_t>{4, 5, 6});
  CHECK(s.strategy == "lookahead");
  CHECK(s.s_per_token == doctest::Approx(0.25));     // (0.2 + 0.3) / 2, step 0 excluded
  CHECK(s.bytes_per_token == doctest::Approx(250));  // (240 + 260) / 2
  CHECK(s.compute_per_token == doctest::Approx(0.1));
  CHECK(s.measured_steps == 2);
  CHECK(s.skipped_prefill);
  CHECK(s.timing_source == "report tokens");
  CHECK(s.bytes_source == "report tokens");
  CHECK(s.peak_rss_os == 4096);
  CHECK(s.peak_rss_report == 1000);

  // Without per-step io busy times the read rate and busy share are the whole run's.
  CHECK(s.busy_source == "report totals");
  CHECK(s.effective_read_gbps == doctest::Approx(1200 / 0.7 / 1e9));
  CHECK(s.io_busy_share == doctest::Approx(0.7 / 1.5));
  // With them, the decode steps' own: the load and the prefill (step 0) are not the disk's time.
  ChildReport busy = parse_child_report(kNew, "new");
  busy.tokens[0].io_busy_seconds = 0.9;
  busy.tokens[1].io_busy_seconds = 0.15;
  busy.tokens[2].io_busy_seconds = 0.25;
  const RunSample sb = summarize_run(busy, {}, 3, 0);
  CHECK(sb.busy_source == "report tokens");
  CHECK(sb.effective_read_gbps == doctest::Approx(500 / 0.4 / 1e9));  // 500 B in 0.15 + 0.25 s
  CHECK(sb.io_busy_share == doctest::Approx(0.4 / 0.5));
  busy.tokens[2].io_busy_seconds.reset();  // one step without it: the whole run again
  CHECK(summarize_run(busy, {}, 3, 0).busy_source == "report totals");

  // --gen 1: only step 0 exists, so it is what is measured.
  ChildReport one = parse_child_report(kNew, "new");
  one.tokens.resize(1);
  const RunSample s1 = summarize_run(one, {}, 1, 0);
  CHECK(s1.s_per_token == doctest::Approx(1.0));
  CHECK_FALSE(s1.skipped_prefill);
}

TEST_CASE("summarize_run: the old report falls back to the STEP table and totals") {
  const RunSample s = summarize_run(parse_child_report(kOld, "old"), parse_step_table(kStdout), 3, 0);
  CHECK(s.s_per_token == doctest::Approx(0.0006));  // (0.0007 + 0.0005) / 2
  CHECK(s.timing_source == "STEP table");
  CHECK(s.bytes_per_token == 0);
  CHECK(s.bytes_source == "none");
  CHECK(s.compute_per_token == 0);

  const RunSample t = summarize_run(parse_child_report(kOld, "old"), {}, 2, 0);
  CHECK(t.s_per_token == doctest::Approx(0.0018));
  CHECK(t.timing_source == "seconds_per_token");

  ChildReport totals = parse_child_report(kNew, "new");
  totals.tokens.clear();
  const RunSample u = summarize_run(totals, {}, 3, 0);
  CHECK(u.bytes_per_token == doctest::Approx(400));  // 1200 / 3
  CHECK(u.bytes_source == "report totals / gen");
  CHECK(u.compute_per_token == doctest::Approx(0.2));  // 0.6 / 3
}

TEST_CASE("aggregate: median and min over repeats, T_io, T_cpu, busy shares, overlap, hit rates, RSS") {
  std::vector<RunSample> runs(3);
  const double s[] = {0.5, 0.3, 0.4};
  for (int i = 0; i < 3; ++i) {
    runs[i].s_per_token = s[i];
    runs[i].bytes_per_token = 1e9;
    runs[i].compute_per_token = 0.1 * (i + 1);
    runs[i].lookahead_predicted = 10;
    runs[i].lookahead_used = 5 + i;
    runs[i].expert_requests = 4;
    runs[i].expert_hits = 1;
    runs[i].peak_rss_os = 100 + i;
    runs[i].peak_rss_report = 90;
    runs[i].ids = {1, 2};
  }
  StrategyResult r = aggregate("overlap", runs, Ceiling{4.0, 4.0}, std::nullopt, 101);
  CHECK(r.s_per_token == doctest::Approx(0.4));
  CHECK(r.s_per_token_min == doctest::Approx(0.3));
  CHECK(r.bytes_per_token == doctest::Approx(1e9));
  CHECK(r.t_io == doctest::Approx(0.25));
  CHECK(r.t_cpu == doctest::Approx(0.2));  // the runs' own compute (median), no resident figure
  CHECK(r.disk_busy == doctest::Approx(0.625));
  CHECK(r.cpu_busy == doctest::Approx(0.5));
  CHECK(r.overlap_efficiency == doctest::Approx(0.625));
  REQUIRE(r.lookahead_hit_rate);
  CHECK(*r.lookahead_hit_rate == doctest::Approx(18.0 / 30.0));
  REQUIRE(r.expert_hit_rate);
  CHECK(*r.expert_hit_rate == doctest::Approx(0.25));
  CHECK(r.peak_rss_bytes == 102);
  CHECK(r.report_peak_rss_bytes == 90);
  CHECK(r.over_budget);

  r = aggregate("serial", runs, Ceiling{4.0, 4.0}, 0.5, 0);
  CHECK(r.t_cpu == doctest::Approx(0.5));  // resident figure wins
  CHECK(r.overlap_efficiency == doctest::Approx(1.25));
  CHECK_FALSE(r.over_budget);  // no budget known

  for (RunSample& x : runs) x.lookahead_predicted = x.lookahead_used = 0;
  CHECK_FALSE(aggregate("trunk", runs, Ceiling{4.0, 4.0}, 0.5, 0).lookahead_hit_rate);
  CHECK(median({3.0, 1.0, 2.0, 10.0}) == doctest::Approx(2.5));

  // Split bytes: trunk at the sequential ceiling, experts at the random one; the effective read rate
  // against the ceiling for that mix.
  for (int i = 0; i < 3; ++i) {
    runs[i].trunk_bytes_per_token = 0.8e9;
    runs[i].expert_bytes_per_token = 0.2e9;
    runs[i].effective_read_gbps = 2.0 + i;  // median 3
    runs[i].io_wait_per_token = 0.04;
    runs[i].io_busy_share = 0.9;
  }
  r = aggregate("overlap", runs, Ceiling{8.0, 2.0}, 0.5, 0);
  CHECK(r.t_io == doctest::Approx(0.8 / 8.0 + 0.2 / 2.0));
  CHECK(r.ceiling_gbps == doctest::Approx(1.0 / 0.2));
  CHECK(r.effective_read_gbps == doctest::Approx(3.0));
  CHECK(r.read_vs_ceiling == doctest::Approx(3.0 / 5.0));
  CHECK(r.io_wait_share == doctest::Approx(0.04 / 0.4));
  CHECK(r.io_busy_share == doctest::Approx(0.9));
  CHECK(r.attainable_efficiency == 0);  // no CPU share measured: no bound
  // The compute keeps 0.5 of its CPU while reads stream: T_io 0.2, T_cpu 0.5 -> at best 0.5 + 0.5 x 0.2.
  r = aggregate("overlap", runs, Ceiling{8.0, 2.0, 0.5}, 0.5, 0);
  CHECK(r.attainable_s_per_token == doctest::Approx(0.5 + 0.5 * 0.2));
  CHECK(r.attainable_efficiency == doctest::Approx(0.5 / 0.6));
  CHECK(r.overlap_efficiency == doctest::Approx(0.5 / 0.4));  // the measured one is unchanged
  // No random ceiling measured: experts priced at the sequential one.
  CHECK(aggregate("overlap", runs, Ceiling{8.0, 0.0}, 0.5, 0).t_io == doctest::Approx(1.0 / 8.0));
}

TEST_CASE("rank, JSON and last line") {
  BenchSummary sum;
  sum.model = "/m/\"q\"";
  sum.budget_bytes = 1 << 30;
  sum.ceiling_gbps = 2.5;
  sum.ceiling_gbps_samples = {2.4, 2.5, 2.6};
  sum.engine_probe_gbps = 1.5;
  sum.t_cpu_per_token = 0.1;
  sum.cpu_threads = 2;
  sum.cpu_share_reading = 0.68;
  sum.cpu_share_reading_samples = {0.67, 0.68, 0.7};
  sum.cpu_share_quiet = 0.99;
  sum.read_share_beside = 0.6;
  for (auto [name, s, eff] : {std::tuple{"serial", 0.4, 0.25}, {"overlap", 0.2, 0.5}, {"trunk", 0.3, 0.33}}) {
    StrategyResult r;
    r.strategy = name;
    r.s_per_token = s;
    r.s_runs = {s};
    r.overlap_efficiency = eff;
    r.attainable_efficiency = 0.8;
    r.ids = {7, 8};
    sum.strategies.push_back(r);
  }
  rank(sum);
  CHECK(sum.best == "overlap");
  REQUIRE(sum.speedup_vs_serial);
  CHECK(*sum.speedup_vs_serial == doctest::Approx(2.0));
  CHECK(bench_last_line(sum) == "best=overlap overlap_efficiency=0.500 speedup_vs_serial=2.000");

  const std::string json = bench_json(sum);
  simdjson::dom::parser p;
  simdjson::dom::element doc;
  REQUIRE(p.parse(json).get(doc) == simdjson::SUCCESS);
  CHECK(std::string_view(doc["model"]) == "/m/\"q\"");
  CHECK(uint64_t(doc["budget_bytes"]) == uint64_t(1) << 30);
  CHECK(double(doc["ceiling_gbps"]) == doctest::Approx(2.5));
  CHECK(doc["ceiling_gbps_samples"].get_array().size() == 3);
  CHECK(double(doc["engine_probe_gbps"]) == doctest::Approx(1.5));
  CHECK(double(doc["t_cpu_per_token"]) == doctest::Approx(0.1));
  CHECK(std::string_view(doc["best"]) == "overlap");
  CHECK(double(doc["speedup_vs_serial"]) == doctest::Approx(2.0));
  CHECK(doc["strategies"].get_array().size() == 3);
  CHECK(doc["strategies"].at(1)["lookahead_hit_rate"].is_null());
  CHECK(int64_t(doc["strategies"].at(1)["ids"].at(1)) == 8);
  CHECK(int64_t(doc["cpu_threads"]) == 2);
  CHECK(double(doc["cpu_share_reading"]) == doctest::Approx(0.68));
  CHECK(doc["cpu_share_reading_samples"].get_array().size() == 3);
  CHECK(double(doc["cpu_share_quiet"]) == doctest::Approx(0.99));
  CHECK(double(doc["read_share_beside"]) == doctest::Approx(0.6));
  CHECK(double(doc["strategies"].at(1)["attainable_efficiency"]) == doctest::Approx(0.8));
  CHECK(bench_table(sum).find(" bound ") != std::string::npos);
  CHECK(bench_table(sum).find("   0.800 ") != std::string::npos);

  sum.strategies.erase(sum.strategies.begin());  // no serial
  rank(sum);
  CHECK(bench_last_line(sum) == "best=overlap overlap_efficiency=0.500 speedup_vs_serial=n/a");
  REQUIRE(p.parse(bench_json(sum)).get(doc) == simdjson::SUCCESS);
  CHECK(doc["speedup_vs_serial"].is_null());
}
