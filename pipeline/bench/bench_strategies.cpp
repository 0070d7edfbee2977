// `k3flow bench`'s rounds (bench_strategies.hpp): in every repeat the device's ceiling and the
// engine's read pattern probed, the resident run (compute time), then every row, each run a child
// `k3flow generate` whose ids and step-0 logits must equal the first run's.
#include "pipeline/bench/bench_strategies.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "io/error.hpp"
#include "pipeline/bench/device_probe.hpp"
#include "pipeline/graph/reader_options.hpp"
#include "pipeline/run/streaming_run.hpp"
#include "pipeline/support/human_bytes.hpp"

namespace k3::pipeline {

namespace {

namespace fs = std::filesystem;

std::string slurp(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  if (!f) throw io::runtime_error(fmt::format("{}: cannot read", p.string()));
  return std::string(std::istreambuf_iterator<char>(f), {});
}

// Runs children, reduces each to a RunSample and holds every run to the first run's ids and logits.
class Runner {
 public:
  Runner(std::vector<std::string> base, int gen, ScratchDir& tmp)
      : base_(std::move(base)), gen_(gen), tmp_(tmp) {}

  // Throws runtime Error naming `label` when the child fails or its output differs from the
  // reference run's.
  RunSample run(const std::string& label, const std::vector<std::string>& extra,
                const std::vector<fs::path>& cache_dirs) {
    const fs::path report = tmp_ / "run.json", logits = tmp_ / "logits.bin";
    std::error_code ec;
    fs::remove(report, ec);
    fs::remove(logits, ec);
    std::vector<std::string> argv = base_;
    argv.insert(argv.end(), {"--out", report.string(), "--dump-logits", logits.string()});
    argv.insert(argv.end(), extra.begin(), extra.end());
    for (const fs::path& d : cache_dirs) drop_file_cache(d);
    const ChildRun c = run_child(argv, tmp_.path());
    if (!c.ok()) throw io::runtime_error(fmt::format("{}: k3flow generate failed, {}", label, c.failure()));
    const ChildReport rep = parse_child_report(slurp(report), label + " run report");
    RunSample s = summarize_run(rep, parse_step_table(c.out), gen_, c.peak_rss_bytes);
    const std::string lg = slurp(logits);
    if (ref_label_.empty()) {
      ref_label_ = label;
      ref_ids_ = s.ids;
      ref_logits_ = lg;
    } else {
      if (s.ids != ref_ids_)
        throw io::runtime_error(fmt::format("{} emits different ids than {}: [{}] vs [{}]", label, ref_label_,
                                            fmt::join(s.ids, ","), fmt::join(ref_ids_, ",")));
      if (lg != ref_logits_) {
        size_t at = 0;
        while (at < lg.size() && at < ref_logits_.size() && lg[at] == ref_logits_[at]) ++at;
        throw io::runtime_error(fmt::format(
            "{}: step-0 logits are not byte-identical to {}'s ({} vs {} bytes, first difference in logit {})",
            label, ref_label_, lg.size(), ref_logits_.size(), at / 4));
      }
    }
    if (s.peak_rss_report > 0) {
      const double a = double(s.peak_rss_os), b = double(s.peak_rss_report);
      if (std::abs(a - b) > std::max(0.10 * std::max(a, b), 8.0 * (1 << 20)))
        notes.push_back(fmt::format("{}: peak RSS from wait4 {} vs the report's {}", label, human_bytes(a),
                                    human_bytes(b)));
    }
    return s;
  }

  std::vector<std::string> notes;

 private:
  std::vector<std::string> base_;
  int gen_;
  ScratchDir& tmp_;
  std::string ref_label_, ref_logits_;
  std::vector<int32_t> ref_ids_;
};

// ---- 1. the device: its ceiling and the engine's settings, probed at the start of every round ----
class DeviceProbes {
 public:
  DeviceProbes(const BenchArgs& a, const io::ModelConfig& config, const BenchSetup& s, BenchSummary& sum,
               BenchRounds& out, std::FILE* txt)
      : a_(a),
        pattern_(probe_pattern(config, s.shards, s.trunk ? &*s.trunk : nullptr)),
        sum_(sum),
        out_(out),
        txt_(txt) {
    co_.seconds = a.probe_seconds * 2 / 3;
    // The compute threads' CPU, quiet and beside the reads: as many spinners as the runs compute with.
    co_.cpu_threads = a.threads > 0 ? a.threads : int(std::max(1u, std::thread::hardware_concurrency()));
    sum.cpu_threads = co_.cpu_threads;
    po_.seconds = a.probe_seconds / 3;
    po_.trunk_reader = trunk_reader_options();
    po_.expert_reader = expert_reader_options(pattern_.largest_expert_read(), 1);
  }

  // One probe per round, beside the runs it prices: a single probe at the start caught whatever the
  // host's disk was doing in those seconds (on a shared VM the same pattern read at 1.97 and 2.63 GB/s
  // minutes apart), and put efficiencies above 1 on the runs that came after a slow probe.
  void round(int r) {
    co_.seed = po_.seed = uint64_t(r) + 1;
    const CeilingResult ceiling = probe_ceiling(pattern_, co_);
    const ProbeResult probe = probe_device(pattern_, po_);
    if (r == 0) {
      std::fprintf(txt_, "%s%s", format_ceiling(ceiling).c_str(), format_probe(pattern_, probe).c_str());
    } else {
      std::fprintf(
          txt_,
          "  [%d/%d] %-10s ceiling %.3f GB/s sequential, %.3f random; engine settings: token pattern "
          "%.3f GB/s, trunk %.3f, experts %.3f; CPU kept while reading %.3f (quiet %.3f)\n",
          r + 1, a_.repeat, "probe", ceiling.gbps(), ceiling.random.gbps(), probe.gbps(), probe.trunk.gbps(),
          probe.experts.gbps(), ceiling.cpu_reading.share, ceiling.cpu_quiet.share);
    }
    std::fflush(txt_);
    sum_.ceiling_gbps_samples.push_back(ceiling.gbps());
    sum_.ceiling_random_gbps_samples.push_back(ceiling.random.gbps());
    sum_.cpu_share_reading_samples.push_back(ceiling.cpu_reading.share);
    sum_.cpu_share_quiet_samples.push_back(ceiling.cpu_quiet.share);
    sum_.read_share_beside_samples.push_back(ceiling.read_share_beside());
    sum_.ceiling_queue_depth = ceiling.queue_depth;
    sum_.ceiling_chunk_bytes = ceiling.chunk_bytes;
    sum_.engine_probe_gbps_samples.push_back(probe.gbps());
    out_.probe_trunk.push_back(probe.trunk.gbps());
    out_.probe_experts.push_back(probe.experts.gbps());
    out_.probed += probe.mixed.bytes + probe.trunk.bytes + probe.experts.bytes + ceiling.sequential.bytes +
                   ceiling.random.bytes;
    out_.probed_direct += probe.mixed.direct_bytes + probe.trunk.direct_bytes + probe.experts.direct_bytes +
                          ceiling.sequential.direct_bytes + ceiling.random.direct_bytes;
  }

 private:
  const BenchArgs& a_;
  const ProbePattern pattern_;
  BenchSummary& sum_;
  BenchRounds& out_;
  std::FILE* txt_;
  CeilingOptions co_;
  ProbeOptions po_;
};

// Whether the rounds measure the compute with every weight resident: when the checkpoint fits the
// available memory, and no routing is replayed.
bool measure_resident(const BenchArgs& a, const BenchSetup& s, BenchSummary& sum, BenchRounds& out,
                      std::FILE* txt) {
  for (uint32_t i = 0; i < s.shards.shard_count(); ++i) out.model_bytes += s.shards.shard_size(i);
  out.avail = available_memory_bytes();
  // The same headroom rule generate applies before it decides to stream when given no budget.
  bool resident = out.model_bytes + out.model_bytes / 8 + (uint64_t{256} << 20) <= out.avail;
  if (!a.routing_replay.empty()) {
    // A resident run cannot replay routing: its ids would differ from every replayed row's.
    resident = false;
    sum.routing_replay = a.routing_replay;
    std::fprintf(txt,
                 "routing replayed from %s: every run's MoE top-k is the trace's, so the ids and logits "
                 "are not the model's (only the cache, the reads and the times mean anything); no resident "
                 "run\n",
                 a.routing_replay.c_str());
  }
  return resident;
}

// ---- 2. compute time per token: `k3flow generate` without a budget, every weight resident ----
void resident_run(const BenchArgs& a, int r, Runner& runner, const BenchChild& child, BenchRounds& out,
                  std::FILE* txt) {
  const RunSample s = runner.run(fmt::format("resident (repeat {})", r + 1), {}, child.caches);
  if (!s.strategy.empty() && s.strategy != "resident") {
    std::fprintf(txt, "compute: generate without a budget ran '%s', not resident\n", s.strategy.c_str());
    out.resident = false;
  } else {
    out.cpu.push_back(s.compute_per_token > 0 ? s.compute_per_token : s.s_per_token);
    out.cpu_wall.push_back(s.s_per_token);
    std::fprintf(txt, "  [%d/%d] %-10s %.4f s/token compute, weights resident (%s)\n", r + 1, a.repeat,
                 "resident", out.cpu.back(), human_bytes(double(out.model_bytes)).c_str());
  }
}

// The flags a row's run adds to the child's base: strategy, budget, trunk, ring, expert policy,
// routing replay, trace.
std::vector<std::string> row_flags(const BenchArgs& a, const BenchSetup& s, const BenchChild& child,
                                   const BenchRow& row, int r) {
  std::vector<std::string> extra;
  if (child.has("--strategy")) extra.insert(extra.end(), {"--strategy", row.strategy});
  if (child.use_preset)
    extra.insert(extra.end(), {"--preset", a.preset});
  else if (child.has("--mem-gb"))
    extra.insert(extra.end(),
                 {"--mem-gb", a.mem_gb ? fmt::format("{}", *a.mem_gb)
                                       : fmt::format("{}", double(s.plan.budget) / double(1 << 30))});
  if (s.trunk && child.has("--trunk")) extra.insert(extra.end(), {"--trunk", row.trunk_dir});
  if (row.ring != 2) extra.insert(extra.end(), {"--ring", std::to_string(row.ring)});
  if (!a.expert_policy.empty()) extra.insert(extra.end(), {"--expert-policy", a.expert_policy});
  if (!a.routing_replay.empty()) extra.insert(extra.end(), {"--bench-routing-replay", a.routing_replay});
  if (!a.trace_dir.empty())
    extra.insert(
        extra.end(),
        {"--trace", (fs::path(a.trace_dir) / fmt::format("{}-r{}.json", row.label, r + 1)).string()});
  return extra;
}

// ---- 3. one row's run: a strategy decoding within the budget ----
RunSample row_run(const BenchArgs& a, const BenchSetup& s, const BenchChild& child, Runner& runner,
                  const BenchRow& row, int r, std::FILE* txt) {
  RunSample sample = runner.run(fmt::format("strategy '{}' (repeat {})", row.label, r + 1),
                                row_flags(a, s, child, row, r), child.caches);
  if (child.has("--strategy") && !sample.strategy.empty() && sample.strategy != row.strategy)
    throw io::runtime_error(fmt::format("strategy '{}' (repeat {}): the run reports strategy '{}'",
                                        row.strategy, r + 1, sample.strategy));
  std::fprintf(txt, "  [%d/%d] %-10s %.4f s/token over %d step%s, %s read/token, peak RSS %s\n", r + 1,
               a.repeat, row.label.c_str(), sample.s_per_token, sample.measured_steps,
               sample.measured_steps == 1 ? "" : "s", human_bytes(sample.bytes_per_token).c_str(),
               human_bytes(double(sample.peak_rss_os)).c_str());
  std::fflush(txt);
  return sample;
}

}  // namespace

bool BenchChild::has(const char* flag) const {
  // Whole-word flag in `generate --help` output ("--trace" does not match "--trace-dir").
  for (size_t at = help.find(flag); at != std::string::npos; at = help.find(flag, at + 1)) {
    const size_t end = at + std::string_view(flag).size();
    const bool starts = at == 0 || help[at - 1] == ' ' || help[at - 1] == ',' || help[at - 1] == '\n';
    const bool ends = end == help.size() || !(std::isalnum(static_cast<unsigned char>(help[end])) ||
                                              help[end] == '-' || help[end] == '_');
    if (starts && ends) return true;
  }
  return false;
}

// ---- 2 + 3. each repeat: the resident run (compute time), then every strategy ----
// Rounds interleave everything, so slow drift of a shared machine lands on every row alike, and the
// compute figure is measured in the same minutes as the runs it is compared with.
BenchRounds run_rounds(const BenchArgs& a, const io::ModelConfig& config, const BenchSetup& s,
                       const BenchChild& child, ScratchDir& tmp, BenchSummary& sum, std::FILE* txt) {
  BenchRounds out;
  DeviceProbes probes(a, config, s, sum, out, txt);
  Runner runner(child.base, a.gen, tmp);
  out.resident = measure_resident(a, s, sum, out, txt);
  if (!a.trace_dir.empty()) fs::create_directories(a.trace_dir);
  out.samples.resize(s.rows.size());
  for (int r = 0; r < a.repeat; ++r) {
    probes.round(r);
    if (out.resident) resident_run(a, r, runner, child, out, txt);
    for (size_t k = 0; k < s.rows.size(); ++k) {
      // with trunk B, the pair (A, B) of a strategy runs B first in every other round
      const size_t i = s.trunk_b && r % 2 == 1 ? k ^ 1 : k;
      out.samples[i].push_back(row_run(a, s, child, runner, s.rows[i], r, txt));
    }
  }
  out.notes = runner.notes;
  return out;
}

}  // namespace k3::pipeline
