#include "pipeline/run_report.hpp"

#include <fmt/format.h>
#include <sys/resource.h>

namespace k3::pipeline {

namespace {
std::string ids(const std::vector<int32_t>& v) {
  return fmt::format("[{}]", fmt::join(v, ","));
}
}  // namespace

std::string to_json(const RunReport& r) {
  return fmt::format(
      "{{\"prompt_ids\":{},\"generated_ids\":{},\"full_ids\":{},\"layers\":{},\"threads\":{},\"incremental\":"
      "{},"
      "\"peak_rss_bytes\":{},\"wall_seconds\":{:.4f},\"seconds_per_token\":{:.4f}}}\n",
      ids(r.prompt_ids), ids(r.generated_ids), ids(r.full_ids), r.layers, r.threads,
      r.incremental ? "true" : "false", r.peak_rss_bytes, r.wall_seconds, r.seconds_per_token);
}

uint64_t peak_rss_bytes() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<uint64_t>(u.ru_maxrss) * 1024;
}

}  // namespace k3::pipeline
