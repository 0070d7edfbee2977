#include "pipeline/serve/metrics.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "pipeline/run/streaming_run.hpp"
#include "pipeline/support/process_memory.hpp"

namespace k3::pipeline::serve {

void Metrics::count(std::string_view endpoint, int status) {
  std::lock_guard lock(m_);
  ++requests_[{std::string(endpoint), status}];
}

namespace {

void family(std::string& out, const char* name, const char* type, const char* help) {
  out += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
}

template <class T>
void sample(std::string& out, const char* name, T value) {
  out += fmt::format("{} {}\n", name, value);
}

}  // namespace

std::string Metrics::render(const Scheduler& s) const {
  const Gauges& g = s.gauges();
  std::string out;
  family(out, "k3flow_requests_total", "counter", "HTTP requests answered, by endpoint and status.");
  {
    std::lock_guard lock(m_);
    for (const auto& [key, n] : requests_)
      out += fmt::format("k3flow_requests_total{{endpoint=\"{}\",status=\"{}\"}} {}\n", key.first, key.second,
                         n);
  }
  family(out, "k3flow_ready", "gauge", "1 once the model is loaded and requests are served.");
  sample(out, "k3flow_ready", s.phase() == Phase::ready ? 1 : 0);
  family(out, "k3flow_prompt_tokens_total", "counter", "Prompt tokens of the sequences admitted.");
  sample(out, "k3flow_prompt_tokens_total", g.prompt_tokens.load());
  family(out, "k3flow_generated_tokens_total", "counter", "Tokens sampled, over every sequence.");
  sample(out, "k3flow_generated_tokens_total", g.completion_tokens.load());
  family(out, "k3flow_sequences_finished_total", "counter", "Sequences that left the engine.");
  sample(out, "k3flow_sequences_finished_total", g.requests_done.load());
  family(out, "k3flow_decode_steps_total", "counter", "BatchEngine steps (every active sequence fed once).");
  sample(out, "k3flow_decode_steps_total", g.decode_steps.load());
  const double step_s = double(g.step_micros.load()) * 1e-6;
  family(out, "k3flow_decode_step_seconds_total", "counter", "Seconds spent in BatchEngine steps.");
  sample(out, "k3flow_decode_step_seconds_total", fmt::format("{:.6f}", step_s));
  family(out, "k3flow_seconds_per_token", "gauge",
         "Step seconds per generated token, over the run (0 before the first token).");
  const uint64_t toks = g.completion_tokens.load();
  sample(out, "k3flow_seconds_per_token", fmt::format("{:.6f}", toks ? step_s / double(toks) : 0.0));
  family(out, "k3flow_queue_depth", "gauge", "Requests waiting for a sequence slot.");
  sample(out, "k3flow_queue_depth", g.queued.load());
  family(out, "k3flow_active_sequences", "gauge", "Sequences in the engine.");
  sample(out, "k3flow_active_sequences", g.active.load());
  family(out, "k3flow_max_sequences", "gauge", "Sequence slots (--max-seqs).");
  sample(out, "k3flow_max_sequences", s.max_seqs());
  if (s.streamed()) {
    // The StreamRun's totals after the last step, split the way the run report splits them.
    family(out, "k3flow_stream_bytes_read_total", "counter",
           "Trunk and expert bytes the streamed graph has read (the StreamRun's total).");
    sample(out, "k3flow_stream_bytes_read_total", g.stream_bytes.load());
    family(out, "k3flow_trunk_bytes_read_total", "counter", "Trunk (dense layer) bytes read from disk.");
    sample(out, "k3flow_trunk_bytes_read_total", g.trunk_bytes.load());
    family(out, "k3flow_expert_bytes_read_total", "counter", "Routed expert bytes read from disk.");
    sample(out, "k3flow_expert_bytes_read_total", g.expert_bytes.load());
    const uint64_t req = g.expert_requests.load(), hits = g.expert_hits.load();
    family(out, "k3flow_expert_hits_total", "counter",
           "Expert uses served from the expert cache (or a prefetch already issued).");
    sample(out, "k3flow_expert_hits_total", hits);
    family(out, "k3flow_expert_misses_total", "counter", "Expert uses that had to be read on demand.");
    sample(out, "k3flow_expert_misses_total", req > hits ? req - hits : 0);
    const double io_s = double(g.io_busy_micros.load()) * 1e-6,
                 cpu_s = double(g.compute_busy_micros.load()) * 1e-6;
    family(out, "k3flow_io_busy_seconds_total", "counter", "Seconds the weight readers were busy.");
    sample(out, "k3flow_io_busy_seconds_total", fmt::format("{:.6f}", io_s));
    family(out, "k3flow_compute_busy_seconds_total", "counter",
           "Seconds the graph's compute nodes were busy.");
    sample(out, "k3flow_compute_busy_seconds_total", fmt::format("{:.6f}", cpu_s));
    family(out, "k3flow_overlap_efficiency", "gauge",
           "max(I/O busy, compute busy) / decode step seconds, over the run (1 = the slower side never "
           "waited; 0 before the first step).");
    sample(out, "k3flow_overlap_efficiency",
           fmt::format("{:.4f}", step_s > 0 ? std::max(io_s, cpu_s) / step_s : 0.0));
  }
  if (s.prompt_cache_budget() > 0) {
    family(out, "k3flow_prompt_cache_hits_total", "counter",
           "Admitted prompts that resumed from a cached prefix's state.");
    sample(out, "k3flow_prompt_cache_hits_total", g.cache_hits.load());
    family(out, "k3flow_prompt_cache_misses_total", "counter", "Admitted prompts with no cached prefix.");
    sample(out, "k3flow_prompt_cache_misses_total", g.cache_misses.load());
    family(out, "k3flow_prompt_cache_hit_tokens_total", "counter",
           "Prompt tokens restored from the prompt cache instead of prefilled.");
    sample(out, "k3flow_prompt_cache_hit_tokens_total", g.cache_hit_tokens.load());
    family(out, "k3flow_prompt_cache_snapshots_total", "counter", "Prefix snapshots taken into the cache.");
    sample(out, "k3flow_prompt_cache_snapshots_total", g.cache_inserts.load());
    family(out, "k3flow_prompt_cache_evictions_total", "counter",
           "Snapshots evicted to stay within the budget.");
    sample(out, "k3flow_prompt_cache_evictions_total", g.cache_evictions.load());
    family(out, "k3flow_prompt_cache_snapshots", "gauge", "Snapshots held.");
    sample(out, "k3flow_prompt_cache_snapshots", g.cache_entries.load());
    family(out, "k3flow_prompt_cache_bytes", "gauge", "Bytes the held snapshots take (state and ids).");
    sample(out, "k3flow_prompt_cache_bytes", g.cache_bytes.load());
    family(out, "k3flow_prompt_cache_budget_bytes", "gauge",
           "The prompt cache's budget (--prompt-cache-gb).");
    sample(out, "k3flow_prompt_cache_budget_bytes", s.prompt_cache_budget());
  }
  family(out, "k3flow_load_bytes_read", "gauge", "Bytes read while the model loaded.");
  sample(out, "k3flow_load_bytes_read", g.load_bytes_read.load());
  family(out, "k3flow_resident_memory_bytes", "gauge", "Resident set size of the server (VmRSS).");
  sample(out, "k3flow_resident_memory_bytes", current_rss_bytes());
  return out;
}

}  // namespace k3::pipeline::serve
