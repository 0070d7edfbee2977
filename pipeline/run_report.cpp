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
  std::string tokens;
  for (const RunReport::Token& t : r.tokens)
    tokens += fmt::format(
        "{}{{\"step\":{},\"token\":{},\"wall_seconds\":{:.6f},\"io_wait_seconds\":{:.6f},\"compute_seconds\":"
        "{:.6f},\"trunk_bytes\":{},\"expert_bytes\":{},\"io_busy_seconds\":{:.6f}}}",
        tokens.empty() ? "" : ",", t.step, t.token, t.wall_seconds, t.io_wait_seconds, t.compute_seconds,
        t.trunk_bytes, t.expert_bytes, t.io_busy_seconds);
  return fmt::format(
      "{{\"prompt_ids\":{},\"generated_ids\":{},\"full_ids\":{},\"layers\":{},\"threads\":{},\"incremental\":"
      "{},\"interrupted\":{},"
      "\"peak_rss_bytes\":{},\"wall_seconds\":{:.4f},\"seconds_per_token\":{:.4f},"
      "\"strategy\":\"{}\",\"budget_bytes\":{},\"trunk_bytes_read\":{},\"expert_bytes_read\":{},"
      "\"expert_requests\":{},\"expert_hits\":{},\"lookahead_predicted\":{},\"lookahead_used\":{},"
      "\"uring_bytes\":{},\"pread_bytes\":{},\"io_busy_seconds\":{:.6f},\"compute_busy_seconds\":{:.6f},"
      "\"overlap_efficiency\":{:.4f},\"tokens\":[{}]}}\n",
      ids(r.prompt_ids), ids(r.generated_ids), ids(r.full_ids), r.layers, r.threads,
      r.incremental ? "true" : "false", r.interrupted ? "true" : "false", r.peak_rss_bytes, r.wall_seconds,
      r.seconds_per_token, r.strategy, r.budget_bytes, r.trunk_bytes_read, r.expert_bytes_read,
      r.expert_requests, r.expert_hits, r.lookahead_predicted, r.lookahead_used, r.uring_bytes, r.pread_bytes,
      r.io_busy_seconds, r.compute_busy_seconds, r.overlap_efficiency, tokens);
}

uint64_t peak_rss_bytes() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<uint64_t>(u.ru_maxrss) * 1024;
}

}  // namespace k3::pipeline
