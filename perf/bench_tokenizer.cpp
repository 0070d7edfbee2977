// Tokenizer benchmark, one thread (run it under `taskset -c N` for one core): load time of a rank
// file and encode throughput on the fixture corpus repeated to a few MB, with the o200k and the
// Kimi pattern over the same ranks. perf/run_tokenizer_bench.sh runs it against tiktoken (npm,
// perf/tokenizer_baseline.mjs) on the same text, alternating A/B.
//
//   bench_tokenizer [--ranks FILE] [--corpus-dir DIR] [--mb N] [--reps N]
//                   [--write-text FILE] [--dump-ids PREFIX]
// Prints one line per sample, `k3flow METRIC VALUE` (load_cpu_ms, encode_o200k_cpu_mbps, their
// wall-clock twins, ...); each encode sample encodes the text enough times for about --mb MB. With
// --dump-ids, writes PREFIX.o200k.bin / PREFIX.kimi.bin (little-endian uint32 ids of one encode).
#include <simdjson.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <string>
#include <string_view>
#include <vector>

#include "io/error.hpp"
#include "io/text/tokenizer.hpp"
#include "io/text/unicode_classes.hpp"

namespace {

using k3::io::text::Pattern;
using k3::io::text::Tokenizer;
using Clock = std::chrono::steady_clock;

// Wall and this thread's CPU time: the host is shared, so CPU time is the steadier measure of work.
struct Stopwatch {
  Clock::time_point wall = Clock::now();
  double cpu = cpu_now();

  static double cpu_now() {
    timespec ts{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
  }
  double wall_s() const { return std::chrono::duration<double>(Clock::now() - wall).count(); }
  double cpu_s() const { return cpu_now() - cpu; }
};

// The whole_file texts of the two corpus case files, concatenated and repeated while the result
// stays within one of Moonshot's 400,000-code-point chunks: tiktoken does not chunk, so on longer
// text the two would (rightly) differ at the chunk cuts. Throughput comes from encoding it repeatedly.
std::string bench_text(const std::string& dir) {
  std::string unit;
  for (const char* name : {"o200k_cases.json", "kimi_pattern_cases.json"}) {
    simdjson::dom::parser parser;
    simdjson::dom::element root;
    std::string_view text;
    const std::string path = dir + "/" + name;
    if (parser.load(path).get(root) != simdjson::SUCCESS ||
        root["whole_file"]["text"].get(text) != simdjson::SUCCESS)
      throw k3::io::runtime_error(path + ": cannot read whole_file.text");
    unit += text;
  }
  const auto code_points = [](std::string_view s) {
    return size_t(std::count_if(s.begin(), s.end(), [](char c) { return (uint8_t(c) & 0xC0) != 0x80; }));
  };
  const size_t per_unit = code_points(unit);
  std::string out = unit;
  while (code_points(out) + per_unit <= 400'000) out += unit;
  return out;
}

void write_file(const std::string& path, const void* data, size_t n) {
  std::ofstream f(path, std::ios::binary);
  f.write(static_cast<const char*>(data), std::streamsize(n));
  if (!f) throw k3::io::runtime_error(path + ": cannot write");
}

}  // namespace

int main(int argc, char** argv) {
  std::string ranks = "fixtures/tokenizer/o200k_base.tiktoken";  // relative to the source tree
  std::string corpus_dir = "fixtures/tokenizer";
  std::string write_text, dump_ids;
  double mb = 4;
  int reps = 3;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "bench_tokenizer: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--ranks")
      ranks = value();
    else if (a == "--corpus-dir")
      corpus_dir = value();
    else if (a == "--mb")
      mb = std::atof(value().c_str());
    else if (a == "--reps")
      reps = std::atoi(value().c_str());
    else if (a == "--write-text")
      write_text = value();
    else if (a == "--dump-ids")
      dump_ids = value();
    else {
      std::fprintf(stderr, "bench_tokenizer: unknown argument %s\n", a.c_str());
      return 2;
    }
  }
  try {
    // The Unicode class table is built once per process; time it apart from the rank file.
    Stopwatch sw;
    k3::io::text::char_classes();
    std::printf("k3flow unicode_table_cpu_ms %.3f\n", 1e3 * sw.cpu_s());

    for (int r = 0; r < reps; ++r) {
      sw = Stopwatch{};
      const Tokenizer tok = Tokenizer::load_vocab(ranks, Pattern::o200k);
      std::printf("k3flow load_cpu_ms %.3f\nk3flow load_wall_ms %.3f\n", 1e3 * sw.cpu_s(), 1e3 * sw.wall_s());
    }

    const std::string text = bench_text(corpus_dir);
    const int calls = std::max(1, int(std::lround(mb * 1e6 / double(text.size()))));
    const double total_mb = double(text.size()) * calls / 1e6;
    if (!write_text.empty()) write_file(write_text, text.data(), text.size());
    std::printf("k3flow text_bytes %zu\nk3flow calls %d\n", text.size(), calls);
    for (const Pattern p : {Pattern::o200k, Pattern::kimi}) {
      const char* name = p == Pattern::o200k ? "o200k" : "kimi";
      const Tokenizer tok = Tokenizer::load_vocab(ranks, p);
      std::vector<int32_t> ids = tok.encode_ordinary(text);  // warm-up, and the ids to compare
      for (int r = 0; r < reps; ++r) {
        sw = Stopwatch{};
        for (int c = 0; c < calls; ++c) ids = tok.encode_ordinary(text);
        std::printf("k3flow encode_%s_cpu_mbps %.3f\nk3flow encode_%s_wall_mbps %.3f\n", name,
                    total_mb / sw.cpu_s(), name, total_mb / sw.wall_s());
      }
      std::printf("k3flow ids_%s %zu\n", name, ids.size());
      if (!dump_ids.empty())
        write_file(dump_ids + "." + name + ".bin", ids.data(), ids.size() * sizeof(int32_t));
    }
  } catch (const k3::io::Error& e) {
    std::fprintf(stderr, "bench_tokenizer: %s\n", e.what());
    return e.kind() == k3::io::ErrorKind::usage ? 2 : 1;
  }
  return 0;
}
