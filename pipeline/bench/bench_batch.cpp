#include "pipeline/bench/bench_batch.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "io/error.hpp"
#include "io/json_text.hpp"
#include "kernels/argmax.hpp"
#include "pipeline/bench/bench_child.hpp"
#include "pipeline/graph/trace.hpp"
#include "pipeline/run/batch_engine.hpp"
#include "pipeline/run/decoder.hpp"
#include "pipeline/run/thread_limit.hpp"
#include "pipeline/support/human_bytes.hpp"

namespace k3::pipeline {

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

double median_of(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// One child's measurements: its BATCH line.
struct BatchSample {
  int batch = 0, decode_steps = 0;
  double decode_s = 0, prefill_s = 0;
  uint64_t trunk = 0, experts = 0;  // bytes read over the decode steps
  std::vector<std::vector<int32_t>> ids;
  uint64_t peak_rss = 0;  // wait4
  double s_per_step() const { return decode_steps ? decode_s / decode_steps : 0; }
};

std::vector<int32_t> parse_ids(const std::string& s) {
  std::vector<int32_t> out;
  std::stringstream in(s);
  std::string x;
  while (std::getline(in, x, ','))
    if (!x.empty()) out.push_back(int32_t(std::strtol(x.c_str(), nullptr, 10)));
  return out;
}

BatchSample parse_batch_line(const std::string& out, const std::string& label) {
  const size_t at = out.rfind("\nBATCH ");
  if (at == std::string::npos)
    throw io::runtime_error(fmt::format("{}: the child printed no BATCH line", label));
  std::stringstream line(out.substr(at + 7, out.find('\n', at + 1) - at - 7));
  BatchSample s;
  std::string kv;
  while (line >> kv) {
    const size_t eq = kv.find('=');
    if (eq == std::string::npos) continue;
    const std::string k = kv.substr(0, eq), v = kv.substr(eq + 1);
    if (k == "b") s.batch = std::atoi(v.c_str());
    if (k == "decode_steps") s.decode_steps = std::atoi(v.c_str());
    if (k == "decode_s") s.decode_s = std::strtod(v.c_str(), nullptr);
    if (k == "prefill_s") s.prefill_s = std::strtod(v.c_str(), nullptr);
    if (k == "trunk") s.trunk = std::strtoull(v.c_str(), nullptr, 10);
    if (k == "experts") s.experts = std::strtoull(v.c_str(), nullptr, 10);
    if (k == "ids") {
      std::stringstream seqs(v);
      std::string one;
      while (std::getline(seqs, one, '/')) s.ids.push_back(parse_ids(one));
    }
  }
  if (s.batch < 1 || int(s.ids.size()) != s.batch)
    throw io::runtime_error(fmt::format("{}: malformed BATCH line", label));
  return s;
}

// The engine a child measures: the bench's budget flags, `capacity` positions per sequence.
DecoderOptions child_options(const BatchBenchArgs& a, size_t capacity, const ThreadLimit& threads) {
  DecoderOptions o;
  o.stream.threads = threads.threads();
  o.model_dir = a.model_dir;
  o.capacity = capacity;
  o.stream.no_progress = true;
  o.stream.trunk_dir = a.trunk_dir;
  o.stream.preset = a.preset;
  if (a.mem_gb) o.stream.mem_gb = *a.mem_gb;
  if (o.stream.budget_given()) o.stream.strategy = a.strategy;
  o.stream.trace = a.trace;  // the engine records its stages' spans; written by run_batch_child
  return o;
}

// `k3flow bench MODEL --batch-child B` with the bench's prompt, budget and threads (and, with
// --trace-dir, the trace file of repeat `r`, counted from 1).
std::vector<std::string> child_argv(const BatchBenchArgs& a, int B, int r = 0) {
  std::vector<std::string> argv = {
      self_exe().string(),   "bench",           a.model_dir,
      "--batch-child",       std::to_string(B), "--gen",
      std::to_string(a.gen), "--ids",           fmt::format("{}", fmt::join(a.ids, ",")),
      "--strategy",          a.strategy};
  if (a.mem_gb)
    argv.insert(argv.end(), {"--mem-gb", fmt::format("{}", *a.mem_gb)});
  else
    argv.insert(argv.end(), {"--preset", a.preset});
  if (!a.trunk_dir.empty()) argv.insert(argv.end(), {"--trunk", a.trunk_dir});
  if (a.threads > 0) argv.insert(argv.end(), {"--threads", std::to_string(a.threads)});
  if (!a.trace_dir.empty() && r > 0)
    argv.insert(argv.end(), {"--batch-trace",
                             (fs::path(a.trace_dir) / fmt::format("batch-b{}-r{}.json", B, r)).string()});
  return argv;
}

std::string budget_text(const BatchBenchArgs& a) {
  return a.mem_gb ? fmt::format("--mem-gb {}", *a.mem_gb) : fmt::format("--preset {}", a.preset);
}

// The results' JSON object opened with what both benches share: the mode and the run's settings.
io::JsonWriter& results_head(io::JsonWriter& w, const BatchBenchArgs& a, const char* mode) {
  return w.begin_object()
      .field("mode", mode)
      .field("model", a.model_dir)
      .field("trunk", a.trunk_dir)
      .field("budget", budget_text(a))
      .field("strategy", a.strategy);
}

// The peak RSS against --mem-gb (a --preset's bytes are the child's to know): said, not hidden.
std::string over_budget(const BatchBenchArgs& a, uint64_t peak_rss) {
  const uint64_t budget_bytes = a.mem_gb ? uint64_t(std::llround(*a.mem_gb * double(uint64_t{1} << 30))) : 0;
  return budget_bytes && peak_rss > budget_bytes
             ? fmt::format("  OVER BUDGET by {}", human_bytes(double(peak_rss - budget_bytes)))
             : std::string();
}

}  // namespace

std::vector<int> parse_batch_list(const std::string& text) {
  std::vector<int> out;
  std::stringstream in(text);
  std::string x;
  while (std::getline(in, x, ',')) {
    char* end = nullptr;
    const long b = std::strtol(x.c_str(), &end, 10);
    if (x.empty() || *end != '\0' || b < 1 || b > 256)
      throw io::usage_error(
          fmt::format("--batch: '{}' is not a batch size 1..256 (e.g. --batch 1,2,4,8)", x));
    if (!out.empty() && b <= out.back())
      throw io::usage_error(fmt::format("--batch {}: sizes must be ascending and distinct", text));
    out.push_back(int(b));
  }
  if (out.empty()) throw io::usage_error("--batch: no batch sizes given");
  return out;
}

int run_batch_child(const BatchBenchArgs& a, int B) {
  const ThreadLimit threads(a.threads);
  const io::ModelConfig cfg = load_model_config(a.model_dir, std::nullopt);
  // optional: ended before the trace is written, so every read the trace starts also ends in it.
  std::optional<BatchEngine> eng(std::in_place, child_options(a, a.ids.size() + size_t(a.gen) + 1, threads),
                                 cfg, B);

  const size_t V = size_t(cfg.vocab), n = size_t(B);
  std::vector<std::vector<int32_t>> prompts(n), out(n);
  for (size_t q = 0; q < n; ++q)
    for (int32_t id : a.ids) prompts[q].push_back(int32_t((int64_t(id) + 31 * int64_t(q)) % cfg.vocab));
  std::vector<std::vector<float>> logits(n, std::vector<float>(V));
  std::vector<int32_t> next(n);
  std::vector<BatchEngine::Row> rows(n);
  const auto totals = [&] { return eng->stream() ? eng->stream()->totals() : StreamTotals{}; };
  const auto take = [&] {
    for (size_t q = 0; q < n; ++q) {
      next[q] = int32_t(kernels::argmax(logits[q]));
      out[q].push_back(next[q]);
    }
  };

  for (size_t q = 0; q < n; ++q) rows[q] = {int(q), prompts[q], logits[q]};
  Clock::time_point t0 = Clock::now();
  eng->step(rows);
  const double prefill = seconds_since(t0);
  take();
  const StreamTotals before = totals();
  t0 = Clock::now();
  for (int step = 1; step < a.gen; ++step) {
    for (size_t q = 0; q < n; ++q) rows[q] = {int(q), std::span<const int32_t>(&next[q], 1), logits[q]};
    eng->step(rows);
    take();
  }
  const double decode = seconds_since(t0);
  const StreamTotals after = totals();
  eng.reset();             // waits for the reads still in flight (the expert lookahead)
  if (!a.trace.empty()) {  // the prefill step and every decode step
    Trace::disable();
    Trace::write(a.trace);
    std::printf("wrote %s (Chrome trace, %zu events)\n", a.trace.c_str(), Trace::event_count());
  }
  std::string ids;
  for (size_t q = 0; q < n; ++q) ids += fmt::format("{}{}", q ? "/" : "", fmt::join(out[q], ","));
  std::printf("\nBATCH b=%d decode_steps=%d decode_s=%.6f prefill_s=%.6f trunk=%llu experts=%llu ids=%s\n", B,
              a.gen - 1, decode, prefill,
              (unsigned long long)(after.trunk_bytes_read - before.trunk_bytes_read),
              (unsigned long long)(after.expert_bytes_read - before.expert_bytes_read), ids.c_str());
  return 0;
}

int run_batch_bench(const BatchBenchArgs& a, const std::vector<int>& batches, std::FILE* txt,
                    std::string* json) {
  ScratchDir tmp("k3batch");
  std::vector<fs::path> cache_dirs = {a.model_dir};
  if (!a.trunk_dir.empty()) cache_dirs.emplace_back(a.trunk_dir);
  const std::string budget = budget_text(a);
  std::fprintf(
      txt,
      "bench --batch: %s, %s, strategy %s, %zu prompt ids per sequence, %d tokens (1 prefill step + %d "
      "decode steps), %d repeat%s, batch sizes %s\n",
      a.model_dir.c_str(), budget.c_str(), a.strategy.c_str(), a.ids.size(), a.gen, a.gen - 1, a.repeat,
      a.repeat == 1 ? "" : "s", fmt::format("{}", fmt::join(batches, ",")).c_str());
  std::fflush(txt);

  std::vector<std::vector<BatchSample>> samples(batches.size());
  std::vector<std::vector<int32_t>> ref;  // sequence q's ids, from the first run that had it
  for (int r = 0; r < a.repeat; ++r)
    for (size_t i = 0; i < batches.size(); ++i) {
      const int B = batches[i];
      const std::string label = fmt::format("batch {} (repeat {})", B, r + 1);
      for (const fs::path& d : cache_dirs) drop_file_cache(d);
      const ChildRun c = run_child(child_argv(a, B, r + 1), tmp.path());
      if (!c.ok())
        throw io::runtime_error(fmt::format("{}: the batched child failed, {}", label, c.failure()));
      BatchSample s = parse_batch_line(c.out, label);
      s.peak_rss = c.peak_rss_bytes;
      for (size_t q = 0; q < s.ids.size(); ++q) {
        if (q == ref.size()) ref.push_back(s.ids[q]);
        if (s.ids[q] != ref[q])
          throw io::runtime_error(fmt::format("{}: sequence {} emits [{}], alone or in a smaller batch [{}]",
                                              label, q, fmt::join(s.ids[q], ","), fmt::join(ref[q], ",")));
      }
      const std::string over = over_budget(a, s.peak_rss);
      std::fprintf(
          txt,
          "  [%d/%d] B=%-3d %.4f s/step, %.2f tokens/s aggregate (prefill step, %zu ids: %.4f s), read/step: "
          "trunk %s + experts %s, peak RSS %s%s\n",
          r + 1, a.repeat, B, s.s_per_step(), s.s_per_step() > 0 ? B / s.s_per_step() : 0.0,
          size_t(B) * a.ids.size(), s.prefill_s,
          human_bytes(double(s.trunk) / std::max(s.decode_steps, 1)).c_str(),
          human_bytes(double(s.experts) / std::max(s.decode_steps, 1)).c_str(),
          human_bytes(double(s.peak_rss)).c_str(), over.c_str());
      std::fflush(txt);
      samples[i].push_back(std::move(s));
    }

  std::fprintf(txt, "\n%5s  %12s  %12s  %14s  %14s  %12s  %12s  %10s  %9s\n", "B", "s/step med", "s/step min",
               "agg tok/s med", "agg tok/s max", "trunk/step", "experts/step", "peak RSS", "vs first");
  io::JsonWriter w;
  results_head(w, a, "batch")
      .field("prompt_ids", a.ids.size())
      .field("gen", a.gen)
      .field("decode_steps", a.gen - 1)
      .field("repeat", a.repeat)
      .field("threads", a.threads)
      .key("batches")
      .begin_array();
  double base = 0;
  for (size_t i = 0; i < batches.size(); ++i) {
    std::vector<double> s;
    uint64_t trunk = 0, experts = 0, peak = 0;
    int steps = 0;
    for (const BatchSample& x : samples[i]) {
      s.push_back(x.s_per_step());
      trunk += x.trunk;
      experts += x.experts;
      steps += x.decode_steps;
      peak = std::max(peak, x.peak_rss);
    }
    const double med = median_of(s), mn = *std::min_element(s.begin(), s.end());
    const double agg = med > 0 ? batches[i] / med : 0;
    if (i == 0) base = agg;
    std::fprintf(txt, "%5d  %12.4f  %12.4f  %14.2f  %14.2f  %12s  %12s  %10s  %8.2fx\n", batches[i], med, mn,
                 agg, mn > 0 ? batches[i] / mn : 0.0, human_bytes(double(trunk) / std::max(steps, 1)).c_str(),
                 human_bytes(double(experts) / std::max(steps, 1)).c_str(), human_bytes(double(peak)).c_str(),
                 base > 0 ? agg / base : 0.0);
    std::vector<double> prefill;
    for (const BatchSample& x : samples[i]) prefill.push_back(x.prefill_s);
    w.begin_object()
        .field("batch", batches[i])
        .field("s_per_step", med)
        .field("s_per_step_min", mn)
        .field("s_per_step_runs", s)
        .field("tokens_per_s", agg)
        .field("tokens_per_s_max", mn > 0 ? batches[i] / mn : 0.0)
        .field("prefill_s_runs", prefill)
        .field("trunk_bytes_per_step", trunk / uint64_t(std::max(steps, 1)))
        .field("expert_bytes_per_step", experts / uint64_t(std::max(steps, 1)))
        .field("peak_rss_bytes", peak)
        .field("vs_first", base > 0 ? agg / base : 0.0)
        .end_object();
  }
  w.end_array().field("same_ids", true).end_object();
  if (json) *json = w.str() + "\n";
  std::fprintf(
      txt,
      "s/step: decode steps 1..%d (the prefill step excluded), median and min over %d repeat%s; per-sequence "
      "s/token = s/step; aggregate tokens/s = B / s/step; the last column: aggregate over B=%d's; peak RSS "
      "from wait4; every sequence emitted the same ids at every B\n",
      a.gen - 1, a.repeat, a.repeat == 1 ? "" : "s", batches.front());
  if (!a.trace_dir.empty())
    std::fprintf(txt,
                 "traces: %s/batch-b<B>-r<repeat>.json, one per run (Chrome trace: open in Perfetto; every "
                 "compute span says its layer, forward call and rows)\n",
                 a.trace_dir.c_str());
  return 0;
}

std::vector<PrefillPolicy::Mode> parse_prefill_modes(const std::string& text) {
  std::vector<PrefillPolicy::Mode> out;
  std::stringstream in(text);
  std::string x;
  while (std::getline(in, x, ',')) {
    const PrefillPolicy::Mode m = parse_prefill_mode(x, "--prefill");
    if (std::find(out.begin(), out.end(), m) != out.end())
      throw io::usage_error(fmt::format("--prefill: '{}' given twice", x));
    out.push_back(m);
  }
  if (out.empty()) throw io::usage_error("--prefill: no mode given (inline, separate)");
  return out;
}

namespace {

// One sequence of the join bench.
struct JoinSeq {
  std::vector<int32_t> pending;  // the prompt's ids not yet fed, or the id sampled last
  bool prompt = true, active = false;
  std::vector<int32_t> out;
  std::vector<double> at;  // when each id was sampled, seconds since the child's first step
  std::vector<float> logits;
};

// One join child's JOIN line.
struct JoinSample {
  double ttft = 0, stall = 0, base = 0, agg = 0, window = 0;
  int steps = 0;
  uint64_t trunk = 0, experts = 0, peak_rss = 0;
  std::string timeline;
  std::vector<std::vector<int32_t>> ids;
};

JoinSample parse_join_line(const std::string& out, int B, const std::string& label) {
  const size_t at = out.rfind("\nJOIN ");
  if (at == std::string::npos)
    throw io::runtime_error(fmt::format("{}: the child printed no JOIN line", label));
  std::stringstream line(out.substr(at + 6, out.find('\n', at + 1) - at - 6));
  JoinSample s;
  std::string kv;
  while (line >> kv) {
    const size_t eq = kv.find('=');
    if (eq == std::string::npos) continue;
    const std::string k = kv.substr(0, eq), v = kv.substr(eq + 1);
    const double d = std::strtod(v.c_str(), nullptr);
    if (k == "ttft") s.ttft = d;
    if (k == "stall") s.stall = d;
    if (k == "base") s.base = d;
    if (k == "agg") s.agg = d;
    if (k == "window") s.window = d;
    if (k == "steps") s.steps = std::atoi(v.c_str());
    if (k == "trunk") s.trunk = std::strtoull(v.c_str(), nullptr, 10);
    if (k == "experts") s.experts = std::strtoull(v.c_str(), nullptr, 10);
    if (k == "timeline") s.timeline = v;
    if (k == "ids") {
      std::stringstream seqs(v);
      std::string one;
      while (std::getline(seqs, one, '/')) s.ids.push_back(parse_ids(one));
    }
  }
  if (int(s.ids.size()) != B || s.ttft <= 0)
    throw io::runtime_error(fmt::format("{}: malformed JOIN line", label));
  return s;
}

}  // namespace

int run_join_child(const BatchBenchArgs& a, int B, PrefillPolicy::Mode mode) {
  const ThreadLimit threads(a.threads);
  const io::ModelConfig cfg = load_model_config(a.model_dir, std::nullopt);
  const size_t n = size_t(B), N = a.join, len = a.ids.size(), gen = size_t(a.gen);
  const size_t chunk = a.chunk ? std::min(a.chunk, N) : N;
  const size_t join_steps = (N + chunk - 1) / chunk;
  // Positions: a running sequence feeds its prompt and kWarmSteps + 1 ids before the join, then at
  // most one id a step until the joiner has `gen` ids (join_steps + gen - 1 steps); the joiner its
  // prompt and gen ids.
  const size_t capacity = std::max(len + kWarmSteps + 1 + join_steps + gen, N + gen + 1);
  BatchEngine eng(child_options(a, capacity, threads), cfg, B);
  eng.set_prefill({.mode = mode, .chunk = a.chunk});

  std::vector<JoinSeq> seqs(n);
  for (size_t q = 0; q < n; ++q) {
    JoinSeq& s = seqs[q];
    s.logits.resize(size_t(cfg.vocab));
    s.active = q + 1 < n;
    if (q + 1 < n) {
      for (int32_t id : a.ids) s.pending.push_back(int32_t((int64_t(id) + 31 * int64_t(q)) % cfg.vocab));
    } else {
      // The joiner: the bench prompt cycled to N ids, shifted per lap so the ids do not repeat.
      for (size_t i = 0; i < N; ++i)
        s.pending.push_back(
            int32_t((int64_t(a.ids[i % len]) + 17 * int64_t(i / len) + 31 * int64_t(q)) % cfg.vocab));
    }
  }
  JoinSeq& joiner = seqs.back();
  const auto totals = [&] { return eng.stream() ? eng.stream()->totals() : StreamTotals{}; };
  const Clock::time_point t0 = Clock::now();
  double t_join = -1;
  StreamTotals at_join{};
  std::string timeline;  // from the join on: "seconds:ids fed" per step
  int steps = 0;
  while (joiner.out.size() < gen) {
    // The joiner arrives once the running sequences have decoded kWarmSteps steps.
    if (!joiner.active && seqs.front().out.size() == size_t(kWarmSteps) + 1) {
      joiner.active = true;
      t_join = seconds_since(t0);
      at_join = totals();
    }
    std::vector<BatchEngine::Pending> pending;
    std::vector<size_t> who;
    for (size_t q = 0; q < n; ++q)
      if (seqs[q].active) {
        pending.push_back({.seq = int(q), .ids = seqs[q].pending.size(), .prompt = seqs[q].prompt});
        who.push_back(q);
      }
    const std::vector<size_t> feed = eng.plan_step(pending);
    std::vector<BatchEngine::Row> rows;
    size_t fed = 0;
    for (size_t i = 0; i < who.size(); ++i)
      if (feed[i] > 0) {
        JoinSeq& s = seqs[who[i]];
        rows.push_back({.seq = int(who[i]),
                        .ids = std::span<const int32_t>(s.pending).first(feed[i]),
                        .logits = s.logits});
        fed += feed[i];
      }
    const double s0 = seconds_since(t0);
    eng.step(rows);
    const double s1 = seconds_since(t0);
    if (t_join >= 0) {
      timeline += fmt::format("{}{:.3f}:{}", timeline.empty() ? "" : ",", s1 - s0, fed);
      ++steps;
    }
    for (size_t i = 0; i < who.size(); ++i) {
      if (feed[i] == 0) continue;
      JoinSeq& s = seqs[who[i]];
      s.pending.erase(s.pending.begin(), s.pending.begin() + long(feed[i]));
      if (!s.pending.empty()) continue;
      s.prompt = false;
      const int32_t id = int32_t(kernels::argmax(s.logits));
      s.out.push_back(id);
      s.at.push_back(s1);
      s.pending.assign(1, id);
    }
  }
  const double t_end = seconds_since(t0);
  const StreamTotals after = totals();

  // The running sequences' gaps between two ids: before the join (decode steps alone) and from it on.
  std::vector<double> before;
  double stall = 0;
  size_t tokens = joiner.out.size();
  for (size_t q = 0; q + 1 < n; ++q) {
    const JoinSeq& s = seqs[q];
    for (size_t k = 1; k < s.at.size(); ++k) {
      if (s.at[k] <= t_join)
        before.push_back(s.at[k] - s.at[k - 1]);
      else
        stall = std::max(stall, s.at[k] - s.at[k - 1]);
    }
    for (double t : s.at) tokens += t > t_join;
  }
  std::string ids;
  for (size_t q = 0; q < n; ++q) ids += fmt::format("{}{}", q ? "/" : "", fmt::join(seqs[q].out, ","));
  std::printf(
      "\nJOIN b=%d mode=%s chunk=%zu n=%zu ttft=%.6f stall=%.6f base=%.6f agg=%.6f window=%.6f steps=%d "
      "trunk=%llu experts=%llu timeline=%s ids=%s\n",
      B, prefill_mode_name(mode), a.chunk, N, joiner.at.front() - t_join, stall, median_of(before),
      double(tokens) / (t_end - t_join), t_end - t_join, steps,
      (unsigned long long)(after.trunk_bytes_read - at_join.trunk_bytes_read),
      (unsigned long long)(after.expert_bytes_read - at_join.expert_bytes_read), timeline.c_str(),
      ids.c_str());
  return 0;
}

int run_join_bench(const BatchBenchArgs& a, int B, std::FILE* txt, std::string* json) {
  ScratchDir tmp("k3join");
  std::vector<fs::path> cache_dirs = {a.model_dir};
  if (!a.trunk_dir.empty()) cache_dirs.emplace_back(a.trunk_dir);
  std::vector<std::string> names;
  for (PrefillPolicy::Mode m : a.modes) names.emplace_back(prefill_mode_name(m));
  std::fprintf(txt,
               "bench --batch %d --join %zu: %s, %s, strategy %s; %d sequences prefill %zu ids and decode %d "
               "steps, then one with a %zu-id prompt joins (prefill %s, chunk %s) and decodes to %d tokens; "
               "%d repeat%s\n",
               B, a.join, a.model_dir.c_str(), budget_text(a).c_str(), a.strategy.c_str(), B - 1,
               a.ids.size(), kWarmSteps, a.join, fmt::format("{}", fmt::join(names, ",")).c_str(),
               a.chunk ? std::to_string(a.chunk).c_str() : "whole prompt", a.gen, a.repeat,
               a.repeat == 1 ? "" : "s");
  std::fflush(txt);

  std::vector<std::vector<JoinSample>> samples(a.modes.size());
  std::vector<std::vector<int32_t>> ref;
  std::string ref_label;
  for (int r = 0; r < a.repeat; ++r)
    for (size_t i = 0; i < a.modes.size(); ++i) {
      const std::string label = fmt::format("{} (repeat {})", names[i], r + 1);
      std::vector<std::string> argv = child_argv(a, B);
      argv.insert(argv.end(), {"--join", std::to_string(a.join), "--prefill", names[i], "--prefill-chunk",
                               std::to_string(a.chunk)});
      for (const fs::path& d : cache_dirs) drop_file_cache(d);
      const ChildRun c = run_child(argv, tmp.path());
      if (!c.ok()) throw io::runtime_error(fmt::format("{}: the join child failed, {}", label, c.failure()));
      JoinSample s = parse_join_line(c.out, B, label);
      s.peak_rss = c.peak_rss_bytes;
      if (ref.empty()) {
        ref = s.ids;
        ref_label = label;
      }
      // The running sequences skip a step in a separate prefill, so they may stop an id short of
      // another mode's run: what both emitted must agree.
      for (size_t q = 0; q < s.ids.size(); ++q) {
        const size_t k = std::min(s.ids[q].size(), ref[q].size());
        if (!std::equal(s.ids[q].begin(), s.ids[q].begin() + long(k), ref[q].begin()))
          throw io::runtime_error(fmt::format("{}: sequence {} emits [{}], {} [{}]", label, q,
                                              fmt::join(s.ids[q], ","), ref_label, fmt::join(ref[q], ",")));
      }
      std::fprintf(
          txt,
          "  [%d/%d] %-8s TTFT %.3f s, running: %.3f s/token before, longest gap %.3f s; %.2f tokens/s "
          "over %.3f s (%d steps: %s), read: trunk %s + experts %s, peak RSS %s%s\n",
          r + 1, a.repeat, names[i].c_str(), s.ttft, s.base, s.stall, s.agg, s.window, s.steps,
          s.timeline.c_str(), human_bytes(double(s.trunk)).c_str(), human_bytes(double(s.experts)).c_str(),
          human_bytes(double(s.peak_rss)).c_str(), over_budget(a, s.peak_rss).c_str());
      std::fflush(txt);
      samples[i].push_back(std::move(s));
    }

  std::fprintf(txt, "\n%-9s  %10s  %10s  %12s  %12s  %12s  %12s  %12s  %10s\n", "prefill", "TTFT med",
               "TTFT min", "s/tok before", "gap med", "gap max", "agg tok/s", "trunk read", "peak RSS");
  io::JsonWriter w;
  results_head(w, a, "join")
      .field("batch", B)
      .field("running_prompt_ids", a.ids.size())
      .field("join_prompt_ids", a.join)
      .field("prefill_chunk", a.chunk)
      .field("gen", a.gen)
      .field("repeat", a.repeat)
      .field("threads", a.threads)
      .key("prefill")
      .begin_array();
  for (size_t i = 0; i < a.modes.size(); ++i) {
    std::vector<double> ttft, base, gap, agg;
    uint64_t trunk = 0, peak = 0;
    for (const JoinSample& x : samples[i]) {
      ttft.push_back(x.ttft);
      base.push_back(x.base);
      gap.push_back(x.stall);
      agg.push_back(x.agg);
      trunk += x.trunk;
      peak = std::max(peak, x.peak_rss);
    }
    std::fprintf(txt, "%-9s  %10.3f  %10.3f  %12.3f  %12.3f  %12.3f  %12.2f  %12s  %10s\n", names[i].c_str(),
                 median_of(ttft), *std::min_element(ttft.begin(), ttft.end()), median_of(base),
                 median_of(gap), *std::max_element(gap.begin(), gap.end()), median_of(agg),
                 human_bytes(double(trunk) / double(samples[i].size())).c_str(),
                 human_bytes(double(peak)).c_str());
    w.begin_object()
        .field("prefill", names[i])
        .field("ttft_s", median_of(ttft))
        .field("ttft_s_min", *std::min_element(ttft.begin(), ttft.end()))
        .field("ttft_s_runs", ttft)
        .field("s_per_token_before", median_of(base))
        .field("gap_s", median_of(gap))
        .field("gap_s_max", *std::max_element(gap.begin(), gap.end()))
        .field("tokens_per_s", median_of(agg))
        .field("trunk_bytes_per_run", trunk / uint64_t(samples[i].size()))
        .field("peak_rss_bytes", peak)
        .end_object();
  }
  w.end_array().field("same_ids", true).end_object();
  if (json) *json = w.str() + "\n";
  std::fprintf(
      txt,
      "TTFT: from the join to the joiner's first id; s/tok before: the running sequences' median gap "
      "between two ids before the join; gap: their longest gap from the join on (the stall); agg "
      "tok/s: every sequence's ids from the join until the joiner has %d, over that time; trunk read: "
      "in that window, per run; medians over %d repeat%s; every sequence emitted the same ids in "
      "every mode\n",
      a.gen, a.repeat, a.repeat == 1 ? "" : "s");
  return 0;
}

}  // namespace k3::pipeline
