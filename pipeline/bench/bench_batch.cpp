#include "pipeline/bench/bench_batch.hpp"

#include <fmt/format.h>
#include <tbb/global_control.h>

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
#include "kernels/argmax.hpp"
#include "pipeline/bench/bench_child.hpp"
#include "pipeline/run/batch_engine.hpp"
#include "pipeline/run/decoder.hpp"
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
  std::optional<tbb::global_control> threads;
  if (a.threads > 0) threads.emplace(tbb::global_control::max_allowed_parallelism, size_t(a.threads));
  const io::ModelConfig cfg = load_model_config(a.model_dir, std::nullopt);
  DecoderOptions o;
  o.model_dir = a.model_dir;
  o.capacity = a.ids.size() + size_t(a.gen) + 1;
  o.stream.no_progress = true;
  o.stream.trunk_dir = a.trunk_dir;
  o.stream.preset = a.preset;
  if (a.mem_gb) o.stream.mem_gb = *a.mem_gb;
  if (o.stream.budget_given()) o.stream.strategy = a.strategy;
  BatchEngine eng(o, cfg, B);

  const size_t V = size_t(cfg.vocab), n = size_t(B);
  std::vector<std::vector<int32_t>> prompts(n), out(n);
  for (size_t q = 0; q < n; ++q)
    for (int32_t id : a.ids) prompts[q].push_back(int32_t((int64_t(id) + 31 * int64_t(q)) % cfg.vocab));
  std::vector<std::vector<float>> logits(n, std::vector<float>(V));
  std::vector<int32_t> next(n);
  std::vector<BatchEngine::Row> rows(n);
  const auto totals = [&] { return eng.stream() ? eng.stream()->totals() : StreamTotals{}; };
  const auto take = [&] {
    for (size_t q = 0; q < n; ++q) {
      next[q] = int32_t(kernels::argmax(logits[q]));
      out[q].push_back(next[q]);
    }
  };

  for (size_t q = 0; q < n; ++q) rows[q] = {int(q), prompts[q], logits[q]};
  Clock::time_point t0 = Clock::now();
  eng.step(rows);
  const double prefill = seconds_since(t0);
  take();
  const StreamTotals before = totals();
  t0 = Clock::now();
  for (int step = 1; step < a.gen; ++step) {
    for (size_t q = 0; q < n; ++q) rows[q] = {int(q), std::span<const int32_t>(&next[q], 1), logits[q]};
    eng.step(rows);
    take();
  }
  const double decode = seconds_since(t0);
  const StreamTotals after = totals();
  std::string ids;
  for (size_t q = 0; q < n; ++q) ids += fmt::format("{}{}", q ? "/" : "", fmt::join(out[q], ","));
  std::printf("\nBATCH b=%d decode_steps=%d decode_s=%.6f prefill_s=%.6f trunk=%llu experts=%llu ids=%s\n", B,
              a.gen - 1, decode, prefill,
              (unsigned long long)(after.trunk_bytes_read - before.trunk_bytes_read),
              (unsigned long long)(after.expert_bytes_read - before.expert_bytes_read), ids.c_str());
  return 0;
}

int run_batch_bench(const BatchBenchArgs& a, const std::vector<int>& batches, std::FILE* txt) {
  const fs::path exe = self_exe();
  ScratchDir tmp("k3batch");
  std::vector<fs::path> cache_dirs = {a.model_dir};
  if (!a.trunk_dir.empty()) cache_dirs.emplace_back(a.trunk_dir);
  const std::string budget =
      a.mem_gb ? fmt::format("--mem-gb {}", *a.mem_gb) : fmt::format("--preset {}", a.preset);
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
      std::vector<std::string> argv = {
          exe.string(),          "bench",           a.model_dir,
          "--batch-child",       std::to_string(B), "--gen",
          std::to_string(a.gen), "--ids",           fmt::format("{}", fmt::join(a.ids, ",")),
          "--strategy",          a.strategy};
      if (a.mem_gb)
        argv.insert(argv.end(), {"--mem-gb", fmt::format("{}", *a.mem_gb)});
      else
        argv.insert(argv.end(), {"--preset", a.preset});
      if (!a.trunk_dir.empty()) argv.insert(argv.end(), {"--trunk", a.trunk_dir});
      if (a.threads > 0) argv.insert(argv.end(), {"--threads", std::to_string(a.threads)});
      for (const fs::path& d : cache_dirs) drop_file_cache(d);
      const ChildRun c = run_child(argv, tmp.path());
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
      // The peak RSS against --mem-gb (a --preset's bytes are the child's to know): said, not hidden.
      const uint64_t budget_bytes =
          a.mem_gb ? uint64_t(std::llround(*a.mem_gb * double(uint64_t{1} << 30))) : 0;
      const std::string over =
          budget_bytes && s.peak_rss > budget_bytes
              ? fmt::format("  OVER BUDGET by {}", human_bytes(double(s.peak_rss - budget_bytes)))
              : std::string();
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
  }
  std::fprintf(
      txt,
      "s/step: decode steps 1..%d (the prefill step excluded), median and min over %d repeat%s; per-sequence "
      "s/token = s/step; aggregate tokens/s = B / s/step; the last column: aggregate over B=%d's; peak RSS "
      "from wait4; every sequence emitted the same ids at every B\n",
      a.gen - 1, a.repeat, a.repeat == 1 ? "" : "s", batches.front());
  return 0;
}

}  // namespace k3::pipeline
