#include "pipeline/run/run_report.hpp"

#include <fmt/format.h>

#include "io/json_text.hpp"

namespace k3::pipeline {

// Timings are written with fixed decimals (microseconds per token, 0.1 ms for the run's totals).
std::string to_json(const RunReport& r) {
  io::JsonWriter w;
  w.begin_object()
      .field("prompt_ids", r.prompt_ids)
      .field("generated_ids", r.generated_ids)
      .field("full_ids", r.full_ids)
      .field("layers", r.layers)
      .field("threads", r.threads)
      .field("incremental", r.incremental)
      .field("interrupted", r.interrupted)
      .field("peak_rss_bytes", r.peak_rss_bytes)
      .fixed_field("wall_seconds", r.wall_seconds, 4)
      .fixed_field("seconds_per_token", r.seconds_per_token, 4)
      .field("strategy", r.strategy)
      .field("routing_replay", r.routing_replay)
      .field("budget_bytes", r.budget_bytes)
      .field("trunk_bytes_read", r.trunk_bytes_read)
      .field("expert_bytes_read", r.expert_bytes_read)
      .field("expert_requests", r.expert_requests)
      .field("expert_hits", r.expert_hits)
      .field("lookahead_predicted", r.lookahead_predicted)
      .field("lookahead_used", r.lookahead_used)
      .field("uring_bytes", r.uring_bytes)
      .field("pread_bytes", r.pread_bytes)
      .fixed_field("io_busy_seconds", r.io_busy_seconds, 6)
      .fixed_field("compute_busy_seconds", r.compute_busy_seconds, 6)
      .fixed_field("overlap_efficiency", r.overlap_efficiency, 4)
      .field("codec", r.codec)
      .field("trunk_decoded_bytes", r.trunk_decoded_bytes)
      .fixed_field("decode_seconds", r.decode_seconds, 6)
      .key("tokens")
      .begin_array();
  for (const RunReport::Token& t : r.tokens)
    w.begin_object()
        .field("step", t.step)
        .field("token", t.token)
        .fixed_field("wall_seconds", t.wall_seconds, 6)
        .fixed_field("io_wait_seconds", t.io_wait_seconds, 6)
        .fixed_field("compute_seconds", t.compute_seconds, 6)
        .field("trunk_bytes", t.trunk_bytes)
        .field("expert_bytes", t.expert_bytes)
        .fixed_field("io_busy_seconds", t.io_busy_seconds, 6)
        .end_object();
  w.end_array();
  if (r.speculative) {
    const SpecReport& s = *r.speculative;
    w.key("speculative")
        .begin_object()
        .field("drafts_per_pass", s.drafts_per_pass)
        .field("policy", s.policy)
        .field("min_match", s.min_match)
        .field("pauses", s.pauses)
        .field("paused_tokens", s.paused_tokens)
        .field("drafted", s.drafted)
        .field("accepted", s.accepted)
        .fixed_field("acceptance", s.drafted ? double(s.accepted) / double(s.drafted) : 0.0, 4)
        .field("passes", s.passes)
        .field("verify_passes", s.verify_passes)
        .field("emitted", s.emitted)
        .fixed_field("passes_per_token", s.emitted ? double(s.passes) / double(s.emitted) : 0.0, 4)
        .key("pass_log")
        .begin_array();
    for (const SpecReportPass& p : s.pass_log)
      w.begin_object()
          .field("rows", p.rows)
          .field("drafted", p.drafted)
          .field("accepted", p.accepted)
          .field("emitted", p.emitted)
          .fixed_field("seconds", p.seconds, 6)
          .end_object();
    w.end_array().end_object();
  }
  w.end_object();
  return w.str() + "\n";
}

}  // namespace k3::pipeline
