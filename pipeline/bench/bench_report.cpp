#include "pipeline/bench/bench_report.hpp"

#include <fmt/format.h>
#include <simdjson.h>

#include <algorithm>
#include <cmath>
#include <sstream>

#include "io/error.hpp"
#include "io/json_text.hpp"
#include "io/safetensors_writer.hpp"
#include "pipeline/bench/cpu_share.hpp"
#include "pipeline/support/human_bytes.hpp"

namespace k3::pipeline {

namespace {

using simdjson::dom::element;

[[noreturn]] void bad(const std::string& source, const std::string& what) {
  throw io::runtime_error(fmt::format("{}: {}", source, what));
}

// A number of any JSON kind as double; absent -> 0, present but not a number -> error.
double num(element obj, const char* key, const std::string& source) {
  element v;
  if (obj[key].get(v) != simdjson::SUCCESS || v.is_null()) return 0;
  double d;
  if (v.get(d) == simdjson::SUCCESS) return d;
  int64_t i;
  if (v.get(i) == simdjson::SUCCESS) return double(i);
  uint64_t u;
  if (v.get(u) == simdjson::SUCCESS) return double(u);
  bad(source, fmt::format("\"{}\" is not a number", key));
}

uint64_t count(element obj, const char* key, const std::string& source) {
  element v;
  if (obj[key].get(v) != simdjson::SUCCESS || v.is_null()) return 0;
  uint64_t u;
  if (v.get(u) == simdjson::SUCCESS) return u;
  int64_t i;
  if (v.get(i) == simdjson::SUCCESS && i >= 0) return uint64_t(i);
  double d;
  if (v.get(d) == simdjson::SUCCESS && d >= 0 && std::isfinite(d)) return uint64_t(std::llround(d));
  bad(source, fmt::format("\"{}\" is not a non-negative integer", key));
}

std::vector<int32_t> id_array(element obj, const char* key, const std::string& source) {
  std::vector<int32_t> out;
  element v;
  if (obj[key].get(v) != simdjson::SUCCESS || v.is_null()) return out;
  simdjson::dom::array a;
  if (v.get(a) != simdjson::SUCCESS) bad(source, fmt::format("\"{}\" is not an array", key));
  for (element x : a) {
    int64_t i;
    if (x.get(i) != simdjson::SUCCESS) bad(source, fmt::format("\"{}\" holds a non-integer", key));
    out.push_back(int32_t(i));
  }
  return out;
}

double mean(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return v.empty() ? 0.0 : s / double(v.size());
}

std::string pct(double share) {
  return fmt::format("{:.1f}%", 100.0 * share);
}

}  // namespace

ChildReport parse_child_report(std::string_view json, const std::string& source) {
  simdjson::dom::parser parser;
  simdjson::padded_string text(json);
  element root;
  if (auto err = parser.parse(text).get(root); err)
    bad(source, fmt::format("not JSON ({})", simdjson::error_message(err)));
  if (!root.is_object()) bad(source, "not a JSON object");
  ChildReport r;
  r.prompt_ids = id_array(root, "prompt_ids", source);
  r.generated_ids = id_array(root, "generated_ids", source);
  r.full_ids = id_array(root, "full_ids", source);
  r.layers = int(count(root, "layers", source));
  r.threads = int(count(root, "threads", source));
  std::string_view strategy;
  if (root["strategy"].get(strategy) == simdjson::SUCCESS) r.strategy = std::string(strategy);
  r.budget_bytes = count(root, "budget_bytes", source);
  r.peak_rss_bytes = count(root, "peak_rss_bytes", source);
  r.trunk_bytes_read = count(root, "trunk_bytes_read", source);
  r.expert_bytes_read = count(root, "expert_bytes_read", source);
  r.expert_requests = count(root, "expert_requests", source);
  r.expert_hits = count(root, "expert_hits", source);
  r.lookahead_predicted = count(root, "lookahead_predicted", source);
  r.lookahead_used = count(root, "lookahead_used", source);
  r.uring_bytes = count(root, "uring_bytes", source);
  r.pread_bytes = count(root, "pread_bytes", source);
  r.seconds_per_token = num(root, "seconds_per_token", source);
  r.io_busy_seconds = num(root, "io_busy_seconds", source);
  r.compute_busy_seconds = num(root, "compute_busy_seconds", source);
  r.wall_seconds = num(root, "wall_seconds", source);
  r.overlap_efficiency = num(root, "overlap_efficiency", source);
  std::string_view codec;
  if (root["codec"].get(codec) == simdjson::SUCCESS) r.codec = std::string(codec);
  r.trunk_decoded_bytes = count(root, "trunk_decoded_bytes", source);
  r.decode_seconds = num(root, "decode_seconds", source);
  element tokens;
  if (root["tokens"].get(tokens) == simdjson::SUCCESS && !tokens.is_null()) {
    simdjson::dom::array a;
    if (tokens.get(a) != simdjson::SUCCESS) bad(source, "\"tokens\" is not an array");
    for (element t : a) {
      if (!t.is_object()) bad(source, "\"tokens\" holds a non-object");
      StepRow s;
      s.step = int(count(t, "step", source));
      s.token = int32_t(count(t, "token", source));
      s.wall_seconds = num(t, "wall_seconds", source);
      s.io_wait_seconds = num(t, "io_wait_seconds", source);
      s.compute_seconds = num(t, "compute_seconds", source);
      s.trunk_bytes = count(t, "trunk_bytes", source);
      s.expert_bytes = count(t, "expert_bytes", source);
      if (t["io_busy_seconds"].error() == simdjson::SUCCESS)
        s.io_busy_seconds = num(t, "io_busy_seconds", source);
      r.tokens.push_back(s);
    }
  }
  return r;
}

std::vector<StepRow> parse_step_table(std::string_view text) {
  std::vector<StepRow> rows;
  std::istringstream in{std::string(text)};
  std::string line;
  bool in_table = false;
  while (std::getline(in, line)) {
    if (!in_table) {
      in_table = line.rfind("STEP", 0) == 0;
      continue;
    }
    if (line.rfind("---", 0) == 0) {
      if (!rows.empty()) break;
      continue;
    }
    std::istringstream f(line);
    long step = -1, token = -1;
    double secs = -1;
    if (!(f >> step >> token >> secs) || step < 0 || token < 0 || secs < 0) continue;  // e.g. "wrote ..."
    StepRow r;
    r.step = int(step);
    r.token = int32_t(token);
    r.wall_seconds = secs;
    rows.push_back(r);
  }
  return rows;
}

RunSample summarize_run(const ChildReport& rep, const std::vector<StepRow>& table, int gen,
                        uint64_t peak_rss_os) {
  RunSample s;
  s.ids = rep.generated_ids;
  s.strategy = rep.strategy;
  s.peak_rss_os = peak_rss_os;
  s.peak_rss_report = rep.peak_rss_bytes;
  s.lookahead_predicted = rep.lookahead_predicted;
  s.lookahead_used = rep.lookahead_used;
  s.expert_requests = rep.expert_requests;
  s.expert_hits = rep.expert_hits;
  s.codec = rep.codec;
  if (gen > 0) {
    s.decoded_bytes_per_token = double(rep.trunk_decoded_bytes) / gen;
    s.decode_seconds_per_token = rep.decode_seconds / gen;
  }

  auto measured = [&](const std::vector<StepRow>& steps) {
    std::vector<StepRow> sel;
    for (const StepRow& r : steps)
      if (gen < 2 || r.step >= 1) sel.push_back(r);
    return sel.empty() ? steps : sel;
  };
  const bool from_report = !rep.tokens.empty();
  const std::vector<StepRow> sel = measured(from_report ? rep.tokens : table);
  if (!sel.empty()) {
    std::vector<double> wall;
    wall.reserve(sel.size());
    for (const StepRow& r : sel) wall.push_back(r.wall_seconds);
    s.s_per_token = mean(wall);
    s.measured_steps = int(sel.size());
    s.skipped_prefill = std::none_of(sel.begin(), sel.end(), [](const StepRow& r) { return r.step == 0; });
    s.timing_source = from_report ? "report tokens" : "STEP table";
  } else {
    s.s_per_token = rep.seconds_per_token;
    s.measured_steps = gen;
    s.timing_source = "seconds_per_token";
  }

  double step_bytes = 0, step_compute = 0, step_trunk = 0, step_expert = 0, step_wait = 0;
  if (from_report)
    for (const StepRow& r : sel) {
      step_bytes += double(r.trunk_bytes + r.expert_bytes);
      step_trunk += double(r.trunk_bytes);
      step_expert += double(r.expert_bytes);
      step_compute += r.compute_seconds;
      step_wait += r.io_wait_seconds;
    }
  if (from_report && !sel.empty()) s.io_wait_per_token = step_wait / double(sel.size());
  const double total_bytes = double(rep.trunk_bytes_read + rep.expert_bytes_read);
  if (step_bytes > 0) {
    s.bytes_per_token = step_bytes / double(sel.size());
    s.trunk_bytes_per_token = step_trunk / double(sel.size());
    s.expert_bytes_per_token = step_expert / double(sel.size());
    s.bytes_source = "report tokens";
  } else if (total_bytes > 0 && gen > 0) {
    s.bytes_per_token = total_bytes / gen;
    s.bytes_source = "report totals / gen";
  } else {
    s.bytes_source = "none";
  }
  double step_busy = 0, step_wall = 0;
  bool per_step = from_report && !sel.empty();
  for (const StepRow& r : sel) {
    per_step = per_step && r.io_busy_seconds.has_value();
    if (r.io_busy_seconds) step_busy += *r.io_busy_seconds;
    step_wall += r.wall_seconds;
  }
  if (per_step && step_busy > 0 && step_bytes > 0) {
    s.effective_read_gbps = step_bytes / step_busy / 1e9;
    if (step_wall > 0) s.io_busy_share = step_busy / step_wall;
    s.busy_source = "report tokens";
  } else {
    if (total_bytes > 0 && rep.io_busy_seconds > 0)
      s.effective_read_gbps = total_bytes / rep.io_busy_seconds / 1e9;
    if (rep.wall_seconds > 0 && rep.io_busy_seconds > 0)
      s.io_busy_share = rep.io_busy_seconds / rep.wall_seconds;
    s.busy_source = "report totals";
  }
  if (step_compute > 0)
    s.compute_per_token = step_compute / double(sel.size());
  else if (rep.compute_busy_seconds > 0 && gen > 0)
    s.compute_per_token = rep.compute_busy_seconds / gen;
  return s;
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

StrategyResult aggregate(const std::string& strategy, const std::vector<RunSample>& runs,
                         const Ceiling& ceiling, std::optional<double> t_cpu_resident,
                         uint64_t budget_bytes) {
  StrategyResult r;
  r.strategy = strategy;
  if (runs.empty()) return r;
  std::vector<double> bytes, compute, trunk_bytes, expert_bytes, effective, wait, busy, decoded, decode_s;
  uint64_t predicted = 0, used = 0, requests = 0, hits = 0;
  for (const RunSample& s : runs) {
    r.s_runs.push_back(s.s_per_token);
    bytes.push_back(s.bytes_per_token);
    trunk_bytes.push_back(s.trunk_bytes_per_token);
    expert_bytes.push_back(s.expert_bytes_per_token);
    compute.push_back(s.compute_per_token);
    effective.push_back(s.effective_read_gbps);
    wait.push_back(s.io_wait_per_token);
    busy.push_back(s.io_busy_share);
    decoded.push_back(s.decoded_bytes_per_token);
    decode_s.push_back(s.decode_seconds_per_token);
    predicted += s.lookahead_predicted;
    used += s.lookahead_used;
    requests += s.expert_requests;
    hits += s.expert_hits;
    r.peak_rss_bytes = std::max(r.peak_rss_bytes, s.peak_rss_os);
    r.report_peak_rss_bytes = std::max(r.report_peak_rss_bytes, s.peak_rss_report);
  }
  r.s_per_token = median(r.s_runs);
  r.s_per_token_min = *std::min_element(r.s_runs.begin(), r.s_runs.end());
  r.bytes_per_token = mean(bytes);
  r.trunk_bytes_per_token = mean(trunk_bytes);
  r.expert_bytes_per_token = mean(expert_bytes);
  r.decoded_bytes_per_token = mean(decoded);
  r.decode_seconds_per_token = mean(decode_s);
  r.codec = runs.front().codec;
  const double seq = ceiling.sequential_gbps * 1e9;
  const double rnd = (ceiling.random_gbps > 0 ? ceiling.random_gbps : ceiling.sequential_gbps) * 1e9;
  if (seq > 0) {
    const bool split = r.trunk_bytes_per_token + r.expert_bytes_per_token > 0;
    r.t_io = split ? r.trunk_bytes_per_token / seq + r.expert_bytes_per_token / rnd : r.bytes_per_token / seq;
  }
  if (r.t_io > 0) r.ceiling_gbps = r.bytes_per_token / r.t_io / 1e9;
  r.effective_read_gbps = median(effective);
  if (r.ceiling_gbps > 0 && r.effective_read_gbps > 0)
    r.read_vs_ceiling = r.effective_read_gbps / r.ceiling_gbps;
  r.io_busy_share = median(busy);
  r.compute_per_token = median(compute);
  r.t_cpu = t_cpu_resident ? *t_cpu_resident : r.compute_per_token;
  if (r.s_per_token > 0) {
    r.disk_busy = r.t_io / r.s_per_token;
    r.cpu_busy = r.t_cpu / r.s_per_token;
    r.overlap_efficiency = std::max(r.t_io, r.t_cpu) / r.s_per_token;
    if (ceiling.cpu_share_reading > 0 && r.t_io > 0) {
      r.attainable_s_per_token = attainable_seconds(r.t_io, r.t_cpu, ceiling.cpu_share_reading);
      r.attainable_efficiency = std::max(r.t_io, r.t_cpu) / r.attainable_s_per_token;
    }
    r.io_wait_share = median(wait) / r.s_per_token;
  }
  if (predicted > 0) r.lookahead_hit_rate = double(used) / double(predicted);
  if (requests > 0) r.expert_hit_rate = double(hits) / double(requests);
  r.over_budget = budget_bytes > 0 && r.peak_rss_bytes > budget_bytes;
  r.ids = runs.front().ids;
  r.timing_source = runs.front().timing_source;
  r.bytes_source = runs.front().bytes_source;
  return r;
}

void rank(BenchSummary& s) {
  s.best.clear();
  s.speedup_vs_serial.reset();
  const StrategyResult* best = nullptr;
  const StrategyResult* serial = nullptr;
  for (const StrategyResult& r : s.strategies) {
    if (!best || r.s_per_token < best->s_per_token) best = &r;
    if (r.strategy == "serial") serial = &r;
  }
  if (!best) return;
  s.best = best->strategy;
  if (serial && best->s_per_token > 0) s.speedup_vs_serial = serial->s_per_token / best->s_per_token;
}

std::string bench_table(const BenchSummary& s) {
  std::string out = fmt::format(
      "{:<10} {:>11} {:>11} {:>12} {:>9} {:>9} {:>11} {:>8} {:>8} {:>10} {:>9} {:>8} {:>10} {:>12}\n",
      "strategy", "s/tok med", "s/tok min", "read/tok", "disk %", "CPU %", "compute/tok", "overlap", "bound",
      "read GB/s", "/ceiling", "io wait", "lookahead", "peak RSS");
  for (const StrategyResult& r : s.strategies) {
    out += fmt::format(
        "{:<10} {:>11.4f} {:>11.4f} {:>12} {:>9} {:>9} {:>11.4f} {:>8.3f} {:>8} {:>10} {:>9} {:>8} {:>10} "
        "{:>12}{}\n",
        r.strategy, r.s_per_token, r.s_per_token_min, human_bytes(r.bytes_per_token), pct(r.disk_busy),
        pct(r.cpu_busy), r.compute_per_token, r.overlap_efficiency,
        r.attainable_efficiency > 0 ? fmt::format("{:.3f}", r.attainable_efficiency) : std::string("-"),
        r.effective_read_gbps > 0 ? fmt::format("{:.3f}", r.effective_read_gbps) : std::string("-"),
        r.read_vs_ceiling > 0 ? fmt::format("{:.3f}", r.read_vs_ceiling) : std::string("-"),
        pct(r.io_wait_share), r.lookahead_hit_rate ? pct(*r.lookahead_hit_rate) : std::string("-"),
        human_bytes(double(r.peak_rss_bytes)), r.over_budget ? "  OVER BUDGET" : "");
  }
  return out;
}

std::string bench_json(const BenchSummary& s) {
  io::JsonWriter w;
  w.begin_object()
      .field("model", s.model)
      .field("routing_replay", s.routing_replay)
      .field("budget_bytes", s.budget_bytes)
      .field("budget_source", s.budget_source)
      .field("ceiling_gbps", s.ceiling_gbps)
      .field("ceiling_gbps_samples", s.ceiling_gbps_samples)
      .field("ceiling_random_gbps", s.ceiling_random_gbps)
      .field("ceiling_random_gbps_samples", s.ceiling_random_gbps_samples)
      .field("ceiling_queue_depth", s.ceiling_queue_depth)
      .field("ceiling_chunk_bytes", s.ceiling_chunk_bytes)
      .field("engine_probe_gbps", s.engine_probe_gbps)
      .field("engine_probe_gbps_samples", s.engine_probe_gbps_samples)
      .field("engine_probe_trunk_gbps", s.engine_probe_trunk_gbps)
      .field("engine_probe_expert_gbps", s.engine_probe_expert_gbps)
      .field("device_direct_fraction", s.device_direct_fraction)
      .field("cpu_threads", s.cpu_threads)
      .field("cpu_share_reading", s.cpu_share_reading)
      .field("cpu_share_reading_samples", s.cpu_share_reading_samples)
      .field("cpu_share_quiet", s.cpu_share_quiet)
      .field("cpu_share_quiet_samples", s.cpu_share_quiet_samples)
      .field("read_share_beside", s.read_share_beside)
      .field("read_share_beside_samples", s.read_share_beside_samples)
      .field("t_cpu_per_token", s.t_cpu_per_token)
      .field("t_cpu_source", s.t_cpu_source)
      .field("gen", s.gen)
      .field("repeat", s.repeat)
      .field("threads", s.threads)
      .field("prompt_ids", s.prompt_ids)
      .field("child_missing_flags", s.child_missing_flags)
      .key("strategies")
      .begin_array();
  for (const StrategyResult& r : s.strategies)
    w.begin_object()
        .field("strategy", r.strategy)
        .field("s_per_token", r.s_per_token)
        .field("s_per_token_min", r.s_per_token_min)
        .field("s_per_token_runs", r.s_runs)
        .field("bytes_per_token", r.bytes_per_token)
        .field("trunk_bytes_per_token", r.trunk_bytes_per_token)
        .field("expert_bytes_per_token", r.expert_bytes_per_token)
        .field("t_io", r.t_io)
        .field("t_cpu", r.t_cpu)
        .field("compute_per_token", r.compute_per_token)
        .field("disk_busy", r.disk_busy)
        .field("cpu_busy", r.cpu_busy)
        .field("overlap_efficiency", r.overlap_efficiency)
        .field("attainable_s_per_token", r.attainable_s_per_token)
        .field("attainable_efficiency", r.attainable_efficiency)
        .field("ceiling_gbps", r.ceiling_gbps)
        .field("effective_read_gbps", r.effective_read_gbps)
        .field("read_vs_ceiling", r.read_vs_ceiling)
        .field("io_wait_share", r.io_wait_share)
        .field("io_busy_share", r.io_busy_share)
        .field("lookahead_hit_rate", r.lookahead_hit_rate)
        .field("expert_hit_rate", r.expert_hit_rate)
        .field("peak_rss_bytes", r.peak_rss_bytes)
        .field("report_peak_rss_bytes", r.report_peak_rss_bytes)
        .field("over_budget", r.over_budget)
        .field("timing_source", r.timing_source)
        .field("bytes_source", r.bytes_source)
        .field("codec", r.codec)
        .field("ring", r.ring)
        .field("decoded_bytes_per_token", r.decoded_bytes_per_token)
        .field("decode_seconds_per_token", r.decode_seconds_per_token)
        .field("ids", r.ids)
        .end_object();
  w.end_array().key("best");
  if (s.best.empty())
    w.value(nullptr);
  else
    w.value(s.best);
  w.field("speedup_vs_serial", s.speedup_vs_serial).end_object();
  return w.str() + "\n";
}

std::string bench_last_line(const BenchSummary& s) {
  double eff = 0;
  for (const StrategyResult& r : s.strategies)
    if (r.strategy == s.best) eff = r.overlap_efficiency;
  return fmt::format("best={} overlap_efficiency={:.3f} speedup_vs_serial={}",
                     s.best.empty() ? "none" : s.best, eff,
                     s.speedup_vs_serial ? fmt::format("{:.3f}", *s.speedup_vs_serial) : "n/a");
}

}  // namespace k3::pipeline
