#include "pipeline/run/speculative.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>

#include "io/error.hpp"
#include "pipeline/graph/trace.hpp"
#include "pipeline/run/decoder.hpp"
#include "pipeline/run/draft_policy.hpp"
#include "stages/forward.hpp"
#include "stages/kda.hpp"

namespace k3::pipeline {

void check_spec_flag(int spec, const stages::SamplerOptions& sampling, bool recompute) {
  if (spec < 0 || spec > kMaxSpec)
    throw io::usage_error(fmt::format("--spec {}: drafts per pass must be 0..{}", spec, kMaxSpec));
  if (spec > 0 && sampling.temperature != 0)
    throw io::usage_error(
        "--spec needs greedy decoding (--temperature 0): speculative sampling is not implemented");
  if (spec > 0 && recompute) throw io::usage_error("--spec needs incremental decoding: drop --recompute");
}

DraftPolicyOptions spec_policy_options(int spec, std::optional<int> min_match,
                                       const std::optional<std::string>& policy) {
  DraftPolicyOptions o;
  o.max_drafts = size_t(std::max(spec, 0));
  if (min_match) {
    if (*min_match < 1 || *min_match > kMaxMinMatch)
      throw io::usage_error(
          fmt::format("--spec-min-match {}: the ids a match needs must be 1..{}", *min_match, kMaxMinMatch));
    if (spec == 0) throw io::usage_error("--spec-min-match needs --spec N (N >= 1)");
    o.min_match = size_t(*min_match);
  }
  if (policy) {
    o.adaptive = parse_spec_policy(*policy);
    if (spec == 0) throw io::usage_error("--spec-policy needs --spec N (N >= 1)");
  }
  return o;
}

std::vector<int32_t> draft_lookup(std::span<const int32_t> seq, size_t n, size_t max_ngram,
                                  size_t min_match) {
  const size_t L = seq.size();
  if (n == 0) return {};
  min_match = std::max<size_t>(1, min_match);
  for (size_t m = std::min(max_ngram, L > 0 ? L - 1 : 0); m >= min_match; --m) {
    const std::span<const int32_t> tail = seq.last(m);
    // Occurrences starting at i, the most recent first; i + m < L so at least one id follows.
    for (size_t i = L - m; i-- > 0;) {
      if (!std::equal(tail.begin(), tail.end(), seq.begin() + std::ptrdiff_t(i))) continue;
      const size_t from = i + m, to = std::min(L, from + n);
      return std::vector<int32_t>(seq.begin() + std::ptrdiff_t(from), seq.begin() + std::ptrdiff_t(to));
    }
  }
  return {};
}

std::vector<PlanTerm> spec_plan_terms(const io::ModelConfig& c, int n_layers, int spec) {
  if (spec <= 0) return {};
  const stages::StateSizes s = stages::StateSizes::of(c, n_layers, 1);
  const uint64_t rows = uint64_t(spec) + 1, row = 4 * uint64_t(stages::kda_journal_row_floats(c));
  // One journal per KDA layer: its state on entry (the layer's kper floats) + every row's inputs.
  const uint64_t each = s.kda_layer_bytes() + rows * row, logits = 4 * uint64_t(spec) * uint64_t(c.vocab);
  std::vector<PlanTerm> terms;
  if (s.n_kda > 0)
    terms.push_back({fmt::format("KDA rollback journal (--spec {}, {} rows)", spec, rows), uint64_t(s.n_kda),
                     each, uint64_t(s.n_kda) * each});
  terms.push_back({fmt::format("verify logits (--spec {}, {} more rows)", spec, spec), uint64_t(spec),
                   4 * uint64_t(c.vocab), logits});
  return terms;
}

namespace {

double clock_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// The row of the trace the passes of a speculative decode sit on (registered once per process).
int passes_track() {
  static const int tid = Trace::register_track("decode: passes", 1);
  return tid;
}

// Counts one pass: the stats' log and, when tracing, its event.
void record_pass(SpecStats& stats, const SpecPass& p, bool traced, uint64_t begin_us) {
  if (stats.log_passes) stats.pass_log.push_back(p);
  if (traced)
    Trace::complete(
        p.drafted > 0 ? "verify pass" : "plain pass", "spec", begin_us, Trace::now_us(),
        TraceArgs{.rows = p.rows, .drafted = p.drafted, .accepted = p.accepted, .emitted = p.emitted},
        passes_track());
}

}  // namespace

int speculative_step(Decoder& dec, stages::Sampler& sampler, int n_draft, int max_tokens, SpecStats& stats,
                     const EmitFn& emit, const DraftFn& drafter, DraftPolicy* policy) {
  if (n_draft > 0 && sampler.options().temperature != 0)
    throw io::usage_error("--spec needs greedy decoding (--temperature 0)");
  if (max_tokens < 1) throw io::runtime_error("speculative_step: no token wanted (internal error)");
  const double t0 = clock_seconds();
  const bool traced = n_draft > 0 && Trace::enabled();
  const uint64_t t0_us = traced ? Trace::now_us() : 0;
  const size_t V = size_t(dec.config().vocab);
  std::vector<int32_t> drafts;
  if (n_draft > 0 && dec.pending() == 1 && !dec.recompute()) {
    const size_t n = size_t(std::min(n_draft, max_tokens - 1));
    drafts = drafter  ? drafter(dec.seq(), n)
             : policy ? policy->propose(dec.seq(), n)
                      : draft_lookup(dec.seq(), n);
    if (drafts.size() > n) drafts.resize(n);
  }
  ++stats.passes;
  if (drafts.empty()) {
    const uint32_t rows = uint32_t(dec.pending());
    const std::span<const float> logits = dec.logits();
    const int32_t next = sampler.next(logits, dec.seq());
    dec.push(next);
    ++stats.emitted;
    emit(next, logits);
    if (policy) policy->observe(0, 0, 1);
    record_pass(stats,
                {.rows = rows, .drafted = 0, .accepted = 0, .emitted = 1, .seconds = clock_seconds() - t0},
                traced, t0_us);
    return 1;
  }

  const size_t base = dec.seq().size() - 1;  // position of the pending id: row 0
  const std::span<const float> logits = dec.verify(drafts);
  ++stats.verifies;
  stats.drafted += drafts.size();
  // Row i's greedy choice with row i's own context (the sequence through row i's id), as the plain
  // step at that position would make it.
  std::vector<int32_t> toks;
  for (size_t i = 0; i <= drafts.size(); ++i) {
    const std::span<const int32_t> ctx = std::span<const int32_t>(dec.seq()).first(base + 1 + i);
    toks.push_back(sampler.next(logits.subspan(i * V, V), ctx));
    if (i == drafts.size() || toks.back() != drafts[i]) break;
  }
  stats.accepted += toks.size() - 1;
  // Emit in order; the decoder keeps the rows whose ids were emitted before the last one (that one
  // is pending, as after a plain step).
  size_t e = 0;
  bool go = true;
  while (go && e < toks.size()) {
    go = emit(toks[e], logits.subspan(e * V, V));
    ++e;
  }
  dec.keep(e);
  dec.push(toks[e - 1]);
  stats.emitted += e;
  if (policy) policy->observe(drafts.size(), toks.size() - 1, e);
  record_pass(stats,
              {.rows = uint32_t(drafts.size() + 1),
               .drafted = uint32_t(drafts.size()),
               .accepted = uint32_t(toks.size() - 1),
               .emitted = uint32_t(e),
               .seconds = clock_seconds() - t0},
              traced, t0_us);
  return int(e);
}

}  // namespace k3::pipeline
