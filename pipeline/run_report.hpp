// The run report of `k3flow generate` (k3_run.json, ENGINE.md §5.5): one JSON line with the
// reference fields plus peak RSS, threads and the decoding mode.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace k3::pipeline {

struct RunReport {
  std::vector<int32_t> prompt_ids;  // the new prompt only
  std::vector<int32_t> generated_ids;
  std::vector<int32_t> full_ids;  // restored history + prompt + generated
  int layers = 0;
  int threads = 0;  // 0 = oneTBB default
  bool incremental = false;
  double seconds_per_token = 0, wall_seconds = 0;
  uint64_t peak_rss_bytes = 0;
};

std::string to_json(const RunReport&);

// getrusage(RUSAGE_SELF).ru_maxrss in bytes.
uint64_t peak_rss_bytes();

}  // namespace k3::pipeline
