// The run report `k3flow generate --out FILE` writes (the references' k3_run.json fields,
// docs/engine.md §5.5): one JSON line with those fields plus peak RSS, threads and the decoding
// mode, then the streamed-decode fields (docs/design.md §5; `k3flow bench` parses them by these
// exact names). A resident run reports strategy "resident" and zeros for the streaming counters.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace k3::pipeline {

// generate --spec N (docs/speculative.md), written as "speculative" after "tokens" when N >= 1:
// the run's totals and one row per forward pass, in order (the first is the prompt's prefill). A
// streamed run's "tokens" rows are per pass too, in the same order. (At namespace scope: clang
// cannot default-construct a nested struct with member initializers inside std::optional.)
struct SpecReportPass {
  int rows = 0, drafted = 0, accepted = 0, emitted = 0;
  double seconds = 0;  // the pass's wall time
};
struct SpecReport {
  int drafts_per_pass = 0;  // N
  // The drafting policy (pipeline/run/draft_policy.hpp): "adaptive", "fixed" or "oracle"
  // (--spec-oracle), the shortest match drafted from, the pauses it made and the tokens in them.
  std::string policy = "adaptive";
  int min_match = 0;
  uint64_t pauses = 0, paused_tokens = 0;
  uint64_t drafted = 0, accepted = 0, passes = 0, verify_passes = 0, emitted = 0;
  std::vector<SpecReportPass> pass_log;
};

struct RunReport {
  std::vector<int32_t> prompt_ids;  // the new prompt only
  std::vector<int32_t> generated_ids;
  std::vector<int32_t> full_ids;  // restored history + prompt + generated
  int layers = 0;
  int threads = 0;  // 0 = oneTBB default
  bool incremental = false;
  bool interrupted = false;  // stopped by Ctrl-C / SIGTERM: covers the tokens before it
  double seconds_per_token = 0, wall_seconds = 0;
  uint64_t peak_rss_bytes = 0;

  // Streamed decode (pipeline/graph/graph.hpp).
  std::string strategy = "resident";
  // bench --routing-replay: the trace the router's top-k came from (the logits are not the model's).
  std::optional<std::string> routing_replay;
  uint64_t budget_bytes = 0, trunk_bytes_read = 0, expert_bytes_read = 0, expert_requests = 0,
           expert_hits = 0, lookahead_predicted = 0, lookahead_used = 0, uring_bytes = 0, pread_bytes = 0;
  double io_busy_seconds = 0;       // wall time with at least one read in flight
  double compute_busy_seconds = 0;  // wall time with a compute node running
  double overlap_efficiency = 0;    // max(io_busy, compute_busy) / decode wall, this run's own measure
  // The trunk's codec ("none": raw; trunk_bytes_read is then the STORED bytes read) and the decode
  // stage's output bytes and wall time (pipeline/graph/graph.hpp; 0 for a raw trunk).
  std::string codec = "none";
  uint64_t trunk_decoded_bytes = 0;
  double decode_seconds = 0;
  struct Token {
    int step = 0;
    int32_t token = 0;
    double wall_seconds = 0, io_wait_seconds = 0, compute_seconds = 0;
    uint64_t trunk_bytes = 0, expert_bytes = 0;
    double io_busy_seconds = 0;  // of wall_seconds, with a read in flight
  };
  std::vector<Token> tokens;

  std::optional<SpecReport> speculative;  // generate --spec N, N >= 1
};

std::string to_json(const RunReport&);

}  // namespace k3::pipeline
