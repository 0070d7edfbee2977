// `k3flow bench MODEL_DIR [--trunk DIR [--trunk-b DIR]] (--mem-gb X | --preset P) [--strategy LIST]
//  [--gen N] [--repeat R] [--ids LIST] [--threads N] [--ring N[,M]] [--out FILE] [--json]
//  [--trace-dir DIR]`: the overlap strategies compared on one checkpoint and one budget in one run
// (docs/design.md §5). With `--batch 1,2,4,8` it measures batched decode instead, and with
// `--batch B --join N` a prompt joining B - 1 decoding sequences under each `--prefill` mode
// (pipeline/bench/bench_batch.hpp).
// With --trunk-b (a second pack of the same checkpoint, e.g. `pack-trunk --codec exp4`), every
// strategy runs from both trunks, the two alternating inside each round (A first in odd rounds, B
// first in even ones) with the page cache dropped before every run, rows labelled
// `<strategy>@<codec>`; every run must still give the same ids and logits; a comparison follows the
// table: s/token median and min, stored and decoded bytes per token, decode seconds per token
// (docs/codec.md, "The decode stage").
// With --ring 2,3 (several trunk ring depths) every strategy runs once per depth, rows labelled
// `<strategy>@ring<N>`: a deeper ring reads further ahead but pins fewer layers, and which pays
// depends on whether the device or the compute is the bottleneck here, so the bench measures it;
// the line before the last names the fastest row's flags for `k3flow generate`.
//   1. the device's ceiling (pipeline/bench/device_probe.* probe_ceiling: a deep queue of large O_DIRECT
//      requests, independent of the engine's reader settings), and beside it the engine's own read
//      pattern with the engine's settings, once at the start of every round; T_io is priced with the
//      ceiling's medians, so the overlap efficiency cannot divide the engine's rate by itself; then
//      spinner threads (as many as --threads) measure the CPU the compute keeps while those reads
//      stream (cpu_share.hpp), which gives each strategy the `bound` column: the most overlap can
//      reach on this machine;
//   2. compute time per token with every weight resident: `k3flow generate` without a budget, when
//      the model fits in available memory (else each strategy's own compute busy time);
//   3. each strategy decoded R times, each run a child `k3flow generate --strategy S --mem-gb X`
//      (peak RSS from wait4); runs go in rounds (probe, resident, then every strategy) so slow drift of the
//      machine spreads over all rows; every run must emit the same ids and byte-identical logits;
//   4. a table (and JSON: --out FILE, or --json for the JSON alone on stdout, the text then on
//      stderr); the last line is `best=S overlap_efficiency=X speedup_vs_serial=Y`.
// Every run decodes with --incremental (KV cache and KDA state carried), as the reference numbers
// were measured (docs/engine.md §7): without it each step recomputes the whole prefix.
// Flags the child's `generate --help` does not list are not passed, and the report says which were
// missing, so the same bench works against an engine that has not grown them yet.
// K3FLOW_BENCH_CHILD=PATH runs PATH (as `PATH generate ...`) instead of this executable: the tests
// drive the bench with a stand-in engine whose report they control.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "io/config.hpp"
#include "io/env.hpp"
#include "io/error.hpp"
#include "io/packed_trunk.hpp"
#include "io/safetensors.hpp"
#include "pipeline/bench/bench_batch.hpp"
#include "pipeline/bench/bench_child.hpp"
#include "pipeline/bench/bench_commands.hpp"
#include "pipeline/bench/bench_report.hpp"
#include "pipeline/bench/bench_strategies.hpp"
#include "pipeline/graph/planner.hpp"
#include "pipeline/graph/routing_trace.hpp"
#include "pipeline/run/run_context.hpp"
#include "pipeline/support/human_bytes.hpp"
#include "pipeline/support/id_list.hpp"
#include "pipeline/support/output_file.hpp"

namespace k3::pipeline {

namespace {

namespace fs = std::filesystem;

const std::vector<std::string> kStrategies = {"serial", "trunk", "overlap", "lookahead", "auto"};
// The reference engines' benchmark prompt (docs/engine.md §3.8); taken modulo a small synthetic vocab.
const std::vector<int32_t> kDefaultIds = {1008, 10484, 318, 15383, 387};

std::vector<std::string> parse_strategies(const std::string& text) {
  std::vector<std::string> out;
  size_t i = 0;
  while (i <= text.size()) {
    size_t j = text.find(',', i);
    if (j == std::string::npos) j = text.size();
    std::string name = text.substr(i, j - i);
    name.erase(0, name.find_first_not_of(' '));
    name.erase(name.find_last_not_of(' ') + 1);
    if (name.empty())
      throw io::usage_error(
          fmt::format("--strategy: empty name in '{}' (expected e.g. serial,overlap)", text));
    if (std::find(kStrategies.begin(), kStrategies.end(), name) == kStrategies.end())
      throw io::usage_error(
          fmt::format("--strategy: unknown strategy '{}' (known: {})", name, fmt::join(kStrategies, ", ")));
    if (std::find(out.begin(), out.end(), name) != out.end())
      throw io::usage_error(fmt::format("--strategy: '{}' given twice", name));
    out.push_back(name);
    i = j + 1;
  }
  return out;
}

// --ring 2,3: trunk ring slot counts, each 2..64, none twice; separators as for --ids
// (support/id_list.hpp). A usage error names the bad entry.
std::vector<int> parse_rings(const std::string& text) {
  std::vector<int> out;
  for (const int32_t n : parse_id_list(text, "--ring")) {
    if (n < 2 || n > 64)
      throw io::usage_error(
          fmt::format("--ring: {} in '{}' is not a slot count from 2 to 64 (e.g. --ring 2,3)", n, text));
    if (std::find(out.begin(), out.end(), n) != out.end())
      throw io::usage_error(fmt::format("--ring: {} given twice in '{}'", n, text));
    out.push_back(n);
  }
  return out;
}

uint64_t gib_bytes(double gb) {
  if (!(gb > 0) || !std::isfinite(gb) || gb > 1e6)
    throw io::usage_error(fmt::format("--mem-gb {} is not a positive size in GiB", gb));
  return uint64_t(std::llround(gb * double(uint64_t{1} << 30)));
}

// The prompt: --ids, or the reference prompt modulo the vocabulary.
std::vector<int32_t> prompt_ids(const BenchArgs& a, const io::ModelConfig& config) {
  std::vector<int32_t> ids;
  if (a.ids.empty()) {
    for (int32_t id : kDefaultIds) ids.push_back(id % config.vocab);
  } else {
    ids = parse_id_list(a.ids, "--ids", config.vocab);
  }
  return ids;
}

// The JSON document to --out (atomically), then the text's `last_line` if any, then with --json the
// document alone on stdout (the text went to stderr).
void write_results(const BenchArgs& a, const std::string& doc, std::FILE* txt,
                   const std::string& last_line = "") {
  if (!a.out_path.empty()) {
    write_file_atomic(a.out_path, doc);
    std::fprintf(txt, "wrote %s\n", a.out_path.c_str());
  }
  if (!last_line.empty()) std::fprintf(txt, "%s\n", last_line.c_str());
  if (a.json) {
    std::fflush(txt);
    std::fputs(doc.c_str(), stdout);
  }
}

// --batch / --batch-child: the batched-decode bench (pipeline/bench/bench_batch.hpp).
int run_batched(const BenchArgs& a) {
  if (a.preset.empty() && !a.mem_gb)
    throw io::usage_error("bench --batch: give a budget: --mem-gb X or --preset NAME");
  if (parse_rings(a.ring) != std::vector<int>{2})
    throw io::usage_error("bench --batch: --ring is not supported with --batch");
  if (a.join > 0 && !a.trace_dir.empty())
    throw io::usage_error("bench --batch --join: --trace-dir is not supported with --join");
  if (a.batch_child > 0 && (a.json || !a.out_path.empty()))
    throw io::usage_error("bench --batch-child: --json and --out belong to the parent bench");
  if (!a.out_path.empty()) check_writable(a.out_path, "--out");  // before any run
  std::FILE* txt = a.json ? stderr : stdout;
  if (!a.routing_replay.empty()) throw io::usage_error("bench --batch: --routing-replay is not supported");
  if (!a.trace_dir.empty() && a.batch_child == 0) {  // before any run
    std::error_code ec;
    fs::create_directories(a.trace_dir, ec);
    if (ec || !fs::is_directory(a.trace_dir))
      throw io::usage_error(fmt::format("--trace-dir {}: cannot create the directory ({})", a.trace_dir,
                                        ec ? ec.message() : "a file is in the way"));
  }
  BatchBenchArgs b;
  b.model_dir = a.model_dir;
  b.trunk_dir = a.trunk_dir;
  b.preset = a.preset;
  b.mem_gb = a.mem_gb;
  b.gen = a.gen;
  b.repeat = a.repeat;
  b.trace_dir = a.trace_dir;
  b.trace = a.batch_trace;
  if (a.strategies != kAllStrategiesList) {
    const std::vector<std::string> s = parse_strategies(a.strategies);
    if (s.size() != 1) throw io::usage_error("bench --batch: give one --strategy (default auto)");
    b.strategy = s.front();
  }
  const RunContext ctx(ChildRunSpec{.model_dir = a.model_dir, .threads = a.threads});
  b.threads = ctx.threads();
  b.ids = prompt_ids(a, ctx.cfg);
  if (a.join > 0) {
    b.join = a.join;
    b.chunk = a.prefill_chunk;
    b.modes = parse_prefill_modes(a.prefill);
    if (a.batch_child > 0) {
      if (b.modes.size() != 1) throw io::usage_error("--batch-child --join: give one --prefill mode");
      return run_join_child(b, a.batch_child, b.modes.front());
    }
    const std::vector<int> batches = parse_batch_list(a.batch);
    if (batches.size() != 1 || batches.front() < 2)
      throw io::usage_error(fmt::format("--join: give one batch size of at least 2 (--batch {})", a.batch));
    std::string doc;
    run_join_bench(b, batches.front(), txt, &doc);
    write_results(a, doc, txt);
    return 0;
  }
  if (a.batch_child > 0) return run_batch_child(b, a.batch_child);
  std::string doc;
  run_batch_bench(b, parse_batch_list(a.batch), txt, &doc);
  write_results(a, doc, txt);
  return 0;
}

// ---- usage checks ----
struct BenchUsage {
  std::vector<std::string> strategies;
  std::vector<int> rings;
};

BenchUsage check_usage(const BenchArgs& a) {
  BenchUsage u{.strategies = parse_strategies(a.strategies), .rings = parse_rings(a.ring)};
  if (!a.out_path.empty()) check_writable(a.out_path, "--out");  // before any run
  if (a.preset.empty() && !a.mem_gb)
    throw io::usage_error("bench: give a budget: --mem-gb X or --preset NAME");
  if (!a.routing_replay.empty()) {
    check_input_file(a.routing_replay, "--routing-replay");
    read_routing_trace(a.routing_replay);  // a malformed trace is refused here, naming its offset
  }
  return u;
}

// ---- plan: the shards, the trunks, the budget, the plan every ring depth makes, the rows ----
PlanBudget bench_budget(const BenchArgs& a, const PlanInputs& in) {
  PlanBudget pb;
  if (!a.preset.empty()) {
    pb.total = preset_budget(a.preset, in);
    pb.source = fmt::format("--preset {}", a.preset);
  } else {
    pb.total = gib_bytes(*a.mem_gb);
    pb.source = fmt::format("--mem-gb {}", *a.mem_gb);
  }
  return pb;
}

// The rows: every strategy at every ring depth, from --trunk and (with --trunk-b) from trunk B,
// labelled by codec and (with several depths) by ring; A and B of one pair stay adjacent.
std::vector<BenchRow> bench_rows(const BenchArgs& a, const BenchUsage& u, const BenchSetup& s) {
  std::vector<BenchRow> rows;
  std::string la = s.trunk ? io::codec::codec_name(s.trunk->codec()) : "",
              lb = s.trunk_b ? io::codec::codec_name(s.trunk_b->codec()) : "";
  if (s.trunk_b && la == lb) la = "a", lb = "b";
  for (const std::string& st : u.strategies)
    for (int ring : u.rings) {
      const std::string base = u.rings.size() > 1 ? fmt::format("{}@ring{}", st, ring) : st;
      rows.push_back(
          BenchRow{st, s.trunk_b ? fmt::format("{}@{}", base, la) : base, a.trunk_dir, ring, base});
      if (s.trunk_b) rows.push_back(BenchRow{st, fmt::format("{}@{}", base, lb), a.trunk_b_dir, ring, base});
    }
  return rows;
}

BenchSetup plan_bench(const BenchArgs& a, const BenchUsage& u, const io::ModelConfig& config,
                      std::vector<int32_t> ids) {
  BenchSetup s{.ids = std::move(ids), .shards = io::ShardSet::open(fs::path(a.model_dir))};
  if (!a.trunk_b_dir.empty() && a.trunk_dir.empty())
    throw io::usage_error("--trunk-b: give --trunk too (the trunk it is compared with)");
  if (!a.trunk_dir.empty()) s.trunk.emplace(io::PackedTrunk::open(a.trunk_dir, config.n_layers));
  if (!a.trunk_b_dir.empty()) s.trunk_b.emplace(io::PackedTrunk::open(a.trunk_b_dir, config.n_layers));
  const PlanInputs in =
      plan_inputs(config, s.shards, s.trunk ? &*s.trunk : nullptr, s.ids.size() + size_t(a.gen) + 1);
  s.pb = bench_budget(a, in);
  // Every ring depth is planned: a budget below any one's floor is refused here (exit 2), and below
  // trunk B's (a compressed trunk's floor holds a decode slot too). The plan shown is the deepest
  // ring's, whose floor is the highest.
  for (int ring : u.rings) {
    s.pb.ring_slots = ring;
    MemoryPlan p = make_plan(in, s.pb);
    if (s.trunk_b)
      make_plan(plan_inputs(config, s.shards, &*s.trunk_b, s.ids.size() + size_t(a.gen) + 1), s.pb);
    if (s.plan.budget == 0 || p.floor > s.plan.floor) s.plan = std::move(p);
  }
  s.rows = bench_rows(a, u, s);
  return s;
}

// ---- what the child understands ----
BenchChild bench_child(const BenchArgs& a, const BenchUsage& u, const BenchSetup& s, const ScratchDir& tmp,
                       BenchSummary& sum) {
  BenchChild c;
  // Test hook: K3FLOW_BENCH_CHILD names a stand-in for `k3flow` (it is run as `<it> generate ...`).
  const auto stand_in = io::env::text(io::env::kBenchChild);
  c.exe = stand_in ? fs::path(*stand_in) : self_exe();
  const ChildRun help = run_child({c.exe.string(), "generate", "--help"}, tmp.path());
  if (!help.ok()) throw io::runtime_error(fmt::format("k3flow generate --help failed, {}", help.failure()));
  c.help = help.out;
  if (!a.trace_dir.empty() && !c.has("--trace"))
    throw io::usage_error("--trace-dir: this k3flow generate has no --trace flag");
  if (u.rings != std::vector<int>{2} && !c.has("--ring"))
    throw io::usage_error("--ring: this k3flow generate has no --ring flag");
  c.use_preset = !a.preset.empty() && c.has("--preset");
  for (const char* f : {"--strategy", "--mem-gb", "--incremental"})
    if (!c.has(f) && !(std::string(f) == "--mem-gb" && c.use_preset)) sum.child_missing_flags.emplace_back(f);
  if (s.trunk && !c.has("--trunk")) sum.child_missing_flags.emplace_back("--trunk");

  c.base = {
      c.exe.string(), "generate",           a.model_dir, "--ids", fmt::format("{}", fmt::join(s.ids, ",")),
      "--gen",        std::to_string(a.gen)};
  if (c.has("--incremental")) c.base.emplace_back("--incremental");
  if (a.threads > 0) c.base.insert(c.base.end(), {"--threads", std::to_string(a.threads)});
  c.caches = {fs::path(a.model_dir)};
  if (s.trunk) c.caches.emplace_back(a.trunk_dir);
  if (s.trunk_b) c.caches.emplace_back(a.trunk_b_dir);
  return c;
}

void print_header(const BenchArgs& a, const BenchUsage& u, const BenchSetup& s, const BenchChild& c,
                  const BenchSummary& sum, std::FILE* txt) {
  const std::string ring_note =
      u.rings.size() > 1 ? fmt::format(", each at ring {}", fmt::join(u.rings, ",")) : std::string();
  std::fprintf(txt,
               "bench: %s, budget %s (%s; plan floor %s), %zu prompt ids, %d tokens%s, %d repeat%s, "
               "strategies %s%s\n",
               a.model_dir.c_str(), human_bytes(double(s.plan.budget)).c_str(), s.pb.source.c_str(),
               human_bytes(double(s.plan.floor)).c_str(), s.ids.size(), a.gen,
               c.has("--incremental") ? " incremental" : "", a.repeat, a.repeat == 1 ? "" : "s",
               fmt::format("{}", fmt::join(u.strategies, ",")).c_str(), ring_note.c_str());
  if (s.trunk_b)
    std::fprintf(txt, "trunks: A %s (codec %s), B %s (codec %s), alternating in every round\n",
                 a.trunk_dir.c_str(), io::codec::codec_name(s.trunk->codec()), a.trunk_b_dir.c_str(),
                 io::codec::codec_name(s.trunk_b->codec()));
  if (!sum.child_missing_flags.empty())
    std::fprintf(txt,
                 "NOTE: this k3flow generate lacks %s: those flags are not passed, so the rows below do NOT "
                 "compare streaming strategies\n",
                 fmt::format("{}", fmt::join(sum.child_missing_flags, " ")).c_str());
  std::fflush(txt);
}

// ---- report: the compute figure and the device's medians ----
std::optional<double> compute_per_token(const BenchRounds& r, BenchSummary& sum, std::FILE* txt) {
  std::optional<double> t_cpu;
  if (r.resident) {
    t_cpu = median(r.cpu);
    sum.t_cpu_source = fmt::format("resident run, median of {}", r.cpu.size());
    std::fprintf(txt, "compute, weights resident (%s): %.4f s/token median, %.4f min (wall %.4f s/token)\n",
                 human_bytes(double(r.model_bytes)).c_str(), *t_cpu,
                 *std::min_element(r.cpu.begin(), r.cpu.end()), median(r.cpu_wall));
  } else {
    sum.t_cpu_source = "each strategy's compute busy time";
    std::fprintf(txt,
                 "compute: no resident measurement (the model is %s, %s available); T_cpu is each strategy's "
                 "own compute busy time\n",
                 human_bytes(double(r.model_bytes)).c_str(), human_bytes(double(r.avail)).c_str());
  }
  sum.t_cpu_per_token = t_cpu;
  return t_cpu;
}

void device_medians(const BenchRounds& r, BenchSummary& sum, std::FILE* txt) {
  sum.ceiling_gbps = median(sum.ceiling_gbps_samples);
  sum.ceiling_random_gbps = median(sum.ceiling_random_gbps_samples);
  sum.cpu_share_reading = median(sum.cpu_share_reading_samples);
  sum.cpu_share_quiet = median(sum.cpu_share_quiet_samples);
  sum.read_share_beside = median(sum.read_share_beside_samples);
  sum.engine_probe_gbps = median(sum.engine_probe_gbps_samples);
  sum.engine_probe_trunk_gbps = median(r.probe_trunk);
  sum.engine_probe_expert_gbps = median(r.probe_experts);
  sum.device_direct_fraction = r.probed ? double(r.probed_direct) / double(r.probed) : 0.0;
  const auto [gmin, gmax] =
      std::minmax_element(sum.ceiling_gbps_samples.begin(), sum.ceiling_gbps_samples.end());
  std::fprintf(
      txt,
      "device ceiling (%u x %s in flight): %.3f GB/s sequential, median of %zu probe%s (%.3f..%.3f); "
      "%.3f GB/s random expert reads; the engine's settings read its token pattern at %.3f GB/s "
      "(%.3f of the ceiling)\n",
      sum.ceiling_queue_depth, human_bytes(double(sum.ceiling_chunk_bytes)).c_str(), sum.ceiling_gbps,
      sum.ceiling_gbps_samples.size(), sum.ceiling_gbps_samples.size() == 1 ? "" : "s", *gmin, *gmax,
      sum.ceiling_random_gbps, sum.engine_probe_gbps,
      sum.ceiling_gbps > 0 ? sum.engine_probe_gbps / sum.ceiling_gbps : 0.0);
  std::fprintf(
      txt,
      "CPU kept by %d spinning thread%s while the ceiling's reads stream: %.3f of their time, median "
      "of %zu (device quiet: %.3f); the reads beside them: %.3f of the ceiling\n",
      sum.cpu_threads, sum.cpu_threads == 1 ? "" : "s", sum.cpu_share_reading,
      sum.cpu_share_reading_samples.size(), sum.cpu_share_quiet, sum.read_share_beside);
}

// ---- 4. table, JSON, verdict ----
// Every row's samples aggregated against the ceiling and the compute figure, then ranked.
void aggregate_rows(const BenchSetup& s, const BenchRounds& r, std::optional<double> t_cpu,
                    BenchSummary& sum) {
  for (size_t i = 0; i < s.rows.size(); ++i) {
    sum.strategies.push_back(aggregate(
        s.rows[i].label, r.samples[i],
        Ceiling{sum.ceiling_gbps, sum.ceiling_random_gbps, sum.cpu_share_reading}, t_cpu, s.plan.budget));
    sum.strategies.back().ring = s.rows[i].ring;
  }
  rank(sum);
}

// The table, its legend and the NOTE lines about every run.
void print_table(const BenchArgs& a, const BenchRounds& r, const BenchSummary& sum, std::FILE* txt) {
  const RunSample& any = r.samples.front().front();
  std::fprintf(txt, "\n%s", bench_table(sum).c_str());
  std::string steps = "mean over all steps (with --gen 1 only step 0, the prefill, exists)";
  if (any.skipped_prefill)
    steps =
        (a.gen == 2 ? std::string("decode step 1") : fmt::format("mean of decode steps 1..{}", a.gen - 1)) +
        " (step 0, the prefill, excluded)";
  std::fprintf(txt, "s/token: %s; median and min over %d repeat%s\n", steps.c_str(), a.repeat,
               a.repeat == 1 ? "" : "s");
  std::fprintf(
      txt,
      "disk %% = T_io / s/token with T_io = trunk bytes / %.3f GB/s + expert bytes / %.3f GB/s (the device "
      "ceiling's medians); CPU %% = T_cpu / s/token with T_cpu from the %s; overlap = max(T_io, T_cpu) / "
      "s/token; bound = the most overlap can reach on this machine, max(T_io, T_cpu) / max(T_io, T_cpu + "
      "(1 - %.3f) x T_io), the compute keeping %.3f of its CPU while reads are in flight (cpu_share.hpp); "
      "compute/tok = the strategy's own compute busy time per token (above T_cpu: compute ran "
      "slower "
      "while the disk streamed); read GB/s = bytes read / time with a read in flight (decode steps), "
      "/ceiling = "
      "that over the ceiling for the same byte mix; io wait = share of s/token the compute waited on a "
      "read\n",
      sum.ceiling_gbps, sum.ceiling_random_gbps, sum.t_cpu_source.c_str(), sum.cpu_share_reading,
      sum.cpu_share_reading);
  std::fprintf(txt,
               "every run emitted the same ids [%s] and byte-identical step-0 logits; peak RSS from wait4\n",
               fmt::format("{}", fmt::join(any.ids, ",")).c_str());
  if (any.timing_source != "report tokens" || any.bytes_source == "none")
    std::fprintf(
        txt, "NOTE: timing from the %s, bytes from %s (the child's report lacks the per-token fields)\n",
        any.timing_source.c_str(), any.bytes_source == "none" ? "nowhere (0)" : any.bytes_source.c_str());
  for (const StrategyResult& row : sum.strategies)
    if (row.overlap_efficiency > 1.0)
      std::fprintf(txt,
                   "NOTE: %s read faster than the device ceiling's median (overlap %.3f > 1): the device's "
                   "rate drifted "
                   "during this bench; rerun on a quieter machine or with more --repeat\n",
                   row.strategy.c_str(), row.overlap_efficiency);
}

// --trunk-b: trunk A against trunk B, strategy by strategy.
void compare_trunks(const BenchArgs& a, const BenchSetup& s, const BenchSummary& sum, std::FILE* txt) {
  std::fprintf(txt,
               "\ntrunk A (%s) vs trunk B (%s), per strategy: s/token median and min, bytes read per token "
               "(stored) and decoded by the decode stage, decode seconds per token (report totals / gen)\n",
               a.trunk_dir.c_str(), a.trunk_b_dir.c_str());
  for (size_t i = 0; i + 1 < sum.strategies.size(); i += 2) {
    const StrategyResult &ra = sum.strategies[i], &rb = sum.strategies[i + 1];
    auto change = [](double x, double y) {
      return x > 0 ? fmt::format("{:+.1f}%", 100.0 * (y / x - 1)) : "-";
    };
    std::fprintf(
        txt,
        "  %-10s s/token %.4f -> %.4f (%s), min %.4f -> %.4f (%s); read/token %s -> %s; decoded/token "
        "%s -> %s; decode %.4f -> %.4f s/token\n",
        s.rows[i].pair.c_str(), ra.s_per_token, rb.s_per_token,
        change(ra.s_per_token, rb.s_per_token).c_str(), ra.s_per_token_min, rb.s_per_token_min,
        change(ra.s_per_token_min, rb.s_per_token_min).c_str(), human_bytes(ra.bytes_per_token).c_str(),
        human_bytes(rb.bytes_per_token).c_str(), human_bytes(ra.decoded_bytes_per_token).c_str(),
        human_bytes(rb.decoded_bytes_per_token).c_str(), ra.decode_seconds_per_token,
        rb.decode_seconds_per_token);
  }
}

// The fastest row's flags for `k3flow generate`.
void print_fastest(const BenchArgs& a, const BenchSetup& s, const BenchSummary& sum, std::FILE* txt) {
  for (const BenchRow& row : s.rows)
    if (row.label == sum.best) {
      // what the row ran with, so the line can be pasted: budget, threads, strategy, ring, trunk
      std::string flags =
          a.mem_gb ? fmt::format("--mem-gb {}", *a.mem_gb) : fmt::format("--preset {}", a.preset);
      if (a.threads > 0) flags += fmt::format(" --threads {}", a.threads);
      flags += fmt::format(" --strategy {}", row.strategy);
      if (row.ring != 2) flags += fmt::format(" --ring {}", row.ring);
      if (s.trunk) flags += fmt::format(" --trunk {}", row.trunk_dir);
      std::fprintf(txt, "fastest here: k3flow generate %s %s\n", a.model_dir.c_str(), flags.c_str());
    }
}

int run_bench(const BenchArgs& a) {
  // With --json stdout holds the JSON document alone; the progress and the table go to stderr.
  std::FILE* txt = a.json ? stderr : stdout;
  if (!a.batch.empty() || a.batch_child > 0) return run_batched(a);
  const BenchUsage u = check_usage(a);
  const RunContext ctx(ChildRunSpec{.model_dir = a.model_dir, .threads = a.threads});
  const BenchSetup s = plan_bench(a, u, ctx.cfg, prompt_ids(a, ctx.cfg));
  ScratchDir tmp("k3bench");
  BenchSummary sum;
  const BenchChild child = bench_child(a, u, s, tmp, sum);
  print_header(a, u, s, child, sum, txt);
  sum.model = a.model_dir;
  sum.budget_bytes = s.plan.budget;
  sum.budget_source = s.pb.source;
  sum.gen = a.gen;
  sum.repeat = a.repeat;
  sum.threads = ctx.threads();
  sum.prompt_ids = s.ids;

  const BenchRounds rounds = run_rounds(a, ctx.cfg, s, child, tmp, sum, txt);
  const std::optional<double> t_cpu = compute_per_token(rounds, sum, txt);
  device_medians(rounds, sum, txt);
  aggregate_rows(s, rounds, t_cpu, sum);
  print_table(a, rounds, sum, txt);
  if (s.trunk_b) compare_trunks(a, s, sum, txt);
  for (const std::string& n : rounds.notes) std::fprintf(txt, "NOTE: %s\n", n.c_str());
  print_fastest(a, s, sum, txt);
  write_results(a, bench_json(sum), txt, bench_last_line(sum));
  return 0;
}

}  // namespace

Action add_bench(CLI::App& sub) {
  auto a = std::make_shared<BenchArgs>();
  sub.add_option("MODEL_DIR", a->model_dir, "checkpoint directory (config.json + *.safetensors)")->required();
  sub.add_option("--trunk", a->trunk_dir,
                 "packed trunk directory (trunk.json + trunk.bin) the children stream");
  sub.add_option(
      "--trunk-b", a->trunk_b_dir,
      "a second packed trunk of the same checkpoint (e.g. pack-trunk --codec exp4): every strategy "
      "also runs from it, alternating with --trunk in every round, and the two are compared");
  auto* mem = sub.add_option("--mem-gb", a->mem_gb, "memory budget in GiB for every strategy run");
  auto* preset = sub.add_option("--preset", a->preset, "named budget (as k3flow plan): laptop, desktop, ...");
  mem->excludes(preset);
  sub.add_option("--strategy", a->strategies,
                 "comma-separated subset of serial,trunk,overlap,lookahead,auto, run in the order given")
      ->capture_default_str();
  sub.add_option("--gen", a->gen, "tokens per run, >= 2: s/token is the decode steps after the prefill step")
      ->check(CLI::Range(2, 4096))
      ->capture_default_str();
  sub.add_option("--repeat", a->repeat, "runs per strategy (median and min are reported)")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  sub.add_option("--ids", a->ids,
                 "prompt token ids (default: the reference prompt 1008,10484,318,15383,387 "
                 "modulo the vocabulary)");
  sub.add_option("--threads", a->threads, "compute threads for every run (0 = oneTBB default)")
      ->check(CLI::Range(0, 4096));
  sub.add_option("--ring", a->ring,
                 "trunk ring slots of every streamed run, 2..64: more slots read further ahead and pin fewer "
                 "layers; a list (2,3) runs every strategy at each depth, rows <strategy>@ring<N>")
      ->capture_default_str();
  sub.add_option("--expert-policy", a->expert_policy,
                 "expert cache replacement of every streamed run: run (the default) or lru")
      ->check(CLI::IsMember({"lru", "run"}));
  sub.add_option(
      "--routing-replay", a->routing_replay,
      "take every MoE layer's top-k from this routing trace (e.g. fixtures/expert_trace.bin, scaled "
      "to the checkpoint's experts) instead of the router's: the cache and prefetch timed under real "
      "locality; the logits are then not the model's (docs/routing.md)");
  sub.add_option("--out", a->out_path, "write the results as one JSON object to FILE (atomically)");
  sub.add_flag("--json", a->json, "print the results as one JSON object on stdout (the text goes to stderr)");
  sub.add_option("--trace-dir", a->trace_dir,
                 "pass --trace DIR/<strategy>-r<repeat>.json to every strategy run (with --batch: "
                 "DIR/batch-b<B>-r<repeat>.json, every stage's span with the rows it computed)");
  sub.add_option(
         "--probe-seconds", a->probe_seconds,
         "time per round spent measuring the device: 2/3 its ceiling, 1/3 the engine's reader settings")
      ->check(CLI::Range(0.05, 600.0))
      ->capture_default_str();
  sub.add_option(
      "--batch", a->batch,
      "batched decode instead of the strategies: for each batch size B (e.g. 1,2,4,8), B sequences "
      "decoding together in one engine (one --strategy, default auto): aggregate tokens/s, s/token per "
      "sequence, bytes read per step, peak RSS");
  sub.add_option("--join", a->join,
                 "with --batch B: B-1 sequences decode, then one with an N-id prompt joins; each --prefill "
                 "mode's time to first token, the others' stall and aggregate tokens/s")
      ->check(CLI::Range(size_t(1), size_t(65536)));
  sub.add_option("--prefill", a->prefill, "with --join: the prefill modes compared (inline, separate)")
      ->capture_default_str();
  sub.add_option("--prefill-chunk", a->prefill_chunk,
                 "with --join: prompt ids fed per step at most (0: the whole prompt)")
      ->check(CLI::Range(size_t(0), size_t(65536)))
      ->capture_default_str();
  sub.add_option("--batch-child", a->batch_child, "(internal) one --batch run, in this process")
      ->group("")
      ->check(CLI::Range(1, 256));
  sub.add_option("--batch-trace", a->batch_trace, "(internal) the --batch child's Chrome trace")->group("");
  return [a] { return run_bench(*a); };
}

}  // namespace k3::pipeline
