// What `k3flow bench` reads from each `k3flow generate` child and what it makes of it
// (docs/design.md §5): per strategy s/token (median and min over repeats), bytes per token, disk and
// CPU busy shares, overlap efficiency = max(T_io, T_cpu) / T_wall, lookahead hit rate, peak RSS;
// printed as a table and written as one JSON object.
//
// T_io is priced with the device's CEILING (device_probe.hpp probe_ceiling: a deep queue of large
// requests), never with the engine's own read pattern: trunk bytes at the sequential ceiling, expert
// bytes at the random one. Beside it each strategy's effective read rate (bytes read / time with a
// read in flight, from the child's report) and its ratio to the ceiling for the same byte mix say
// whether the engine's readers drive the device at what it can do.
//
// Time per token is taken over the decode steps after step 0 when there are at least two steps:
// step 0 is the prefill (the whole prompt, and at a small budget most of the expert reads), which
// would make a short run's average say more about the prompt than about streaming.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace k3::pipeline {

// One row of the child's per-token table (k3_run.json "tokens", or the STEP table on stdout).
struct StepRow {
  int step = 0;
  int32_t token = 0;
  double wall_seconds = 0, io_wait_seconds = 0, compute_seconds = 0;
  uint64_t trunk_bytes = 0, expert_bytes = 0;
  std::optional<double> io_busy_seconds;  // of wall_seconds, a read in flight (newer reports only)
};

// k3_run.json of `k3flow generate`. Fields the child does not write read as 0 / empty, so an
// older engine (resident only) and the streaming one parse the same way.
struct ChildReport {
  std::vector<int32_t> prompt_ids, generated_ids, full_ids;
  int layers = 0, threads = 0;
  std::string strategy;
  uint64_t budget_bytes = 0, peak_rss_bytes = 0;
  uint64_t trunk_bytes_read = 0, expert_bytes_read = 0, expert_requests = 0, expert_hits = 0;
  uint64_t lookahead_predicted = 0, lookahead_used = 0, uring_bytes = 0, pread_bytes = 0;
  double seconds_per_token = 0, io_busy_seconds = 0, compute_busy_seconds = 0, wall_seconds = 0;
  double overlap_efficiency = 0;
  std::vector<StepRow> tokens;
  // a compressed trunk: trunk_bytes_read are stored bytes; the decode stage's output and time
  std::string codec;  // empty when the report has none
  uint64_t trunk_decoded_bytes = 0;
  double decode_seconds = 0;
};

// Throws runtime Error naming `source` when the text is not a JSON object or a present field has
// the wrong type.
ChildReport parse_child_report(std::string_view json, const std::string& source);

// Rows of the STEP table `k3flow generate` prints (STEP, TOKEN, SECONDS first): wall time only.
std::vector<StepRow> parse_step_table(std::string_view stdout_text);

// One child run, reduced to per-token figures.
struct RunSample {
  std::vector<int32_t> ids;  // generated_ids
  std::string strategy;      // as the child reports it ("resident", a strategy, or empty: not reported)
  double s_per_token = 0;    // mean wall time of the measured steps
  double bytes_per_token = 0;
  double trunk_bytes_per_token = 0, expert_bytes_per_token = 0;  // both 0 when the report has no split
  double compute_per_token = 0;                                  // 0 when the child reports no compute time
  double io_wait_per_token = 0;  // compute waiting on a read, per measured step (report tokens only)
  // Over the measured decode steps when the report has per-step io busy times, else over the whole
  // run (which counts the load and the prefill, where the compute, not the disk, is the bottleneck):
  double effective_read_gbps = 0;  // bytes read / time with a read in flight (0 when not reported)
  double io_busy_share = 0;        // time with a read in flight / wall time (0 when not reported)
  std::string busy_source;         // "report tokens" or "report totals"
  uint64_t lookahead_predicted = 0, lookahead_used = 0, expert_requests = 0, expert_hits = 0;
  uint64_t peak_rss_os = 0, peak_rss_report = 0;
  int measured_steps = 0;
  bool skipped_prefill = false;  // step 0 excluded from the time
  std::string timing_source;     // "report tokens", "STEP table" or "seconds_per_token"
  std::string bytes_source;      // "report tokens", "report totals / gen" or "none"
  // a compressed trunk (report totals / gen: the prefill included): decoded bytes and decode seconds
  double decoded_bytes_per_token = 0, decode_seconds_per_token = 0;
  std::string codec;
};

// `table` is the STEP table of the child's stdout, used only when the report has no tokens.
RunSample summarize_run(const ChildReport& report, const std::vector<StepRow>& table, int gen,
                        uint64_t peak_rss_os);

struct StrategyResult {
  std::string strategy;
  std::vector<double> s_runs;  // per repeat
  double s_per_token = 0;      // median of s_runs
  double s_per_token_min = 0;
  double bytes_per_token = 0;                                    // mean over repeats
  double trunk_bytes_per_token = 0, expert_bytes_per_token = 0;  // mean over repeats
  double t_io = 0;               // trunk bytes / sequential ceiling + expert bytes / random ceiling
  double t_cpu = 0;              // resident compute per token, else this strategy's own compute time
  double compute_per_token = 0;  // this strategy's own compute busy time per token (median): against
                                 // t_cpu it shows how much slower compute runs while the disk streams
  double disk_busy = 0, cpu_busy = 0, overlap_efficiency = 0;  // shares of s_per_token
  // With the ceiling's cpu_share_reading: the fastest a token can be on this machine when the compute
  // keeps only that share of its CPU while reads are in flight (cpu_share.hpp attainable_seconds), and
  // the overlap efficiency that would be -- the most any schedule reaches here. 0 when not measured.
  double attainable_s_per_token = 0, attainable_efficiency = 0;
  double ceiling_gbps = 0;         // the ceiling for this strategy's byte mix: bytes_per_token / t_io
  double effective_read_gbps = 0;  // median over repeats of the run's bytes / io busy time
  double read_vs_ceiling = 0;      // effective_read_gbps / ceiling_gbps (0 when either is unknown)
  double io_wait_share = 0;        // median io wait per token / s_per_token: compute idle on reads
  double io_busy_share = 0;        // median share of the run with a read in flight
  std::optional<double> lookahead_hit_rate;  // none when nothing was predicted
  std::optional<double> expert_hit_rate;     // none when no expert was requested
  uint64_t peak_rss_bytes = 0;               // max over repeats, from wait4
  uint64_t report_peak_rss_bytes = 0;        // max over repeats, from the report
  bool over_budget = false;
  std::vector<int32_t> ids;
  std::string timing_source, bytes_source;
  // a compressed trunk (0 when raw): the decode stage per token, mean over repeats (report totals / gen)
  double decoded_bytes_per_token = 0, decode_seconds_per_token = 0;
  std::string codec;  // the trunk's codec as the child reports it (empty: not reported)
  int ring = 2;       // trunk ring slots the runs were given (bench --ring)
};

// The device's ceiling in 1e9 B/s: sequential prices trunk bytes, random prices expert bytes (and all
// bytes are priced sequential when the report does not split them).
struct Ceiling {
  double sequential_gbps = 0, random_gbps = 0;
  // Of the compute threads' CPU, the share they keep while reads stream (cpu_share.hpp; 0: not
  // measured). Prices `attainable_efficiency`.
  double cpu_share_reading = 0;
};

// t_cpu_resident: compute per token measured resident (step 2), if any.
StrategyResult aggregate(const std::string& strategy, const std::vector<RunSample>& runs,
                         const Ceiling& ceiling, std::optional<double> t_cpu_resident, uint64_t budget_bytes);

double median(std::vector<double> v);

struct BenchSummary {
  std::string model;
  // --routing-replay: the trace every run's router top-k came from (ids and logits not the model's).
  std::optional<std::string> routing_replay;
  uint64_t budget_bytes = 0;
  std::string budget_source;  // "--mem-gb 8" / "--preset laptop"
  // The device's ceiling, probed at the start of each round (queue_depth x chunk_bytes in flight):
  // medians of the samples; T_io is priced with these.
  double ceiling_gbps = 0, ceiling_random_gbps = 0;
  std::vector<double> ceiling_gbps_samples, ceiling_random_gbps_samples;
  unsigned ceiling_queue_depth = 0;
  uint64_t ceiling_chunk_bytes = 0;
  // The same rounds' probe with the ENGINE's reader settings (its token pattern), for comparison.
  double engine_probe_gbps = 0;
  std::vector<double> engine_probe_gbps_samples;
  double engine_probe_trunk_gbps = 0, engine_probe_expert_gbps = 0;
  // The CPU the compute threads keep, spinning (cpu_share.hpp) beside the ceiling's sequential reads
  // and with the device quiet, once a round, and the reads' rate beside them over the ceiling: medians
  // of the samples. 0 when not measured.
  int cpu_threads = 0;
  double cpu_share_reading = 0, cpu_share_quiet = 0, read_share_beside = 0;
  std::vector<double> cpu_share_reading_samples, cpu_share_quiet_samples, read_share_beside_samples;
  double device_direct_fraction = 0;      // of every probe byte, the share read through O_DIRECT
  std::optional<double> t_cpu_per_token;  // resident compute per token (median over repeats)
  std::string t_cpu_source;
  int gen = 0, repeat = 0, threads = 0;
  std::vector<int32_t> prompt_ids;
  std::vector<std::string> child_missing_flags;  // generate flags the bench wanted and did not find
  std::vector<StrategyResult> strategies;
  std::string best;
  std::optional<double> speedup_vs_serial;
};

// Fills best (lowest median s/token) and speedup_vs_serial (serial's median / best's).
void rank(BenchSummary& s);

std::string bench_table(const BenchSummary& s);
std::string bench_json(const BenchSummary& s);       // one object, newline-terminated
std::string bench_last_line(const BenchSummary& s);  // best=... overlap_efficiency=... speedup_vs_serial=...

}  // namespace k3::pipeline
