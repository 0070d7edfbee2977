// Speculative greedy decoding with prompt-lookup drafts (docs/speculative.md). No draft model: the
// drafts are the ids that followed the most recent earlier occurrence of the sequence's last few
// ids. One verify pass feeds the pending id and the k drafts as ONE segment of k+1 rows (one trunk
// pass; the routed experts are the union of the rows') with logits at every row; the drafts are
// accepted while each equals the greedy choice of the row before it, and the first row that
// disagrees (or the row after the last draft) gives the model's own next id. Each row is computed
// with the same kernels and reduction order as a one-row pass, so the ids and every emitted token's
// logits are the bytes plain greedy decoding gives. Only greedy decoding speculates.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "io/config.hpp"
#include "pipeline/graph/planner.hpp"
#include "stages/sampler.hpp"

namespace k3::pipeline {

class Decoder;
class DraftPolicy;
struct DraftPolicyOptions;

// Most drafts a verify pass may carry (--spec 0..kMaxSpec): 17 rows stay far below the 64-row pass
// the activations are sized for, and the logits of a pass grow with the rows.
inline constexpr int kMaxSpec = 16;

// The --spec flag's rules, one place for generate and chat: 0..kMaxSpec drafts, greedy sampling
// only, incremental decoding only. Throws usage Error (exit 2) naming --spec.
void check_spec_flag(int spec, const stages::SamplerOptions& sampling, bool recompute);
// The drafting policy's flags (pipeline/run/draft_policy.hpp): --spec-min-match M (1..kMaxMinMatch,
// default 2) and --spec-policy adaptive|fixed, each refused without --spec N (N >= 1). Throws usage
// Error (exit 2) naming the flag.
DraftPolicyOptions spec_policy_options(int spec, std::optional<int> min_match,
                                       const std::optional<std::string>& policy);
// The longest n-gram the drafter looks up (a --spec-min-match above it looks up that many).
inline constexpr size_t kDraftMaxNgram = 3;

// Prompt lookup: for m = max_ngram down to min_match (at least 1), the last m ids of `seq` are
// searched for earlier in `seq`, most recent occurrence first; the first match gives up to `n` of
// the ids that followed it (fewer when the sequence ends first). Empty when nothing matches or n == 0.
std::vector<int32_t> draft_lookup(std::span<const int32_t> seq, size_t n, size_t max_ngram = kDraftMaxNgram,
                                  size_t min_match = 1);

// One forward pass of a speculative decode: a plain step (drafted 0; rows = the ids it fed, a
// prompt's on the first step) or a verify pass (rows = 1 + drafted).
struct SpecPass {
  uint32_t rows = 0, drafted = 0, accepted = 0;
  uint32_t emitted = 0;  // tokens handed to the caller: accepted + 1, fewer when the caller stopped
  double seconds = 0;    // the pass's wall time, the caller's emits included
};

struct SpecStats {
  uint64_t passes = 0;    // forward passes (trunk passes) the decode made, verify or plain
  uint64_t verifies = 0;  // of them, verify passes (at least one draft)
  uint64_t drafted = 0, accepted = 0;
  uint64_t emitted = 0;     // tokens handed to the caller
  bool log_passes = false;  // keep a SpecPass per pass in pass_log (generate's --out report)
  std::vector<SpecPass> pass_log;
  double acceptance() const { return drafted ? double(accepted) / double(drafted) : 0.0; }
  double passes_per_token() const { return emitted ? double(passes) / double(emitted) : 0.0; }
};

// What --spec N adds to a run's memory, as plan terms (the planner counts them with the other
// always-resident terms, pipeline/run/streaming_run.cpp plan_run): the KDA rollback journal for a
// pass of N + 1 rows over the first `n_layers` layers -- exactly DecodeState::journal_bytes -- and
// the N extra rows of logits the verify pass returns (Decoder::verify). Empty for N = 0.
std::vector<PlanTerm> spec_plan_terms(const io::ModelConfig&, int n_layers, int spec);

// Called for each emitted id in order with that position's logits (valid during the call); returns
// false to stop after this id (the decoder then holds exactly what plain decoding would after it).
using EmitFn = std::function<bool(int32_t id, std::span<const float> logits)>;

// Proposes up to n drafts to follow `seq` (draft_lookup by default; tests pass drafters that know
// the answer, or part of it, to exercise acceptance on models that never repeat themselves).
using DraftFn = std::function<std::vector<int32_t>(std::span<const int32_t> seq, size_t n)>;

// One decode step of `dec` (it must have a pending id): with n_draft > 0, one pending id and drafts
// found, a verify pass; otherwise a plain step (Decoder::logits). The drafts come from `drafter`
// when given, else from `policy` (which then observes every pass, plain ones included), else from
// draft_lookup. Emits 1..min(max_tokens, k+1) ids
// in order (before the decoder has settled: `emit` must not use `dec`), each pushed into `dec` as
// plain decoding would, and returns how many. With n_draft > 0 `sampler` must be greedy
// (temperature 0, else a usage error naming --spec; a repeat penalty is allowed: each row is judged
// with its own context); n_draft = 0 is exactly the plain step, for any sampler.
int speculative_step(Decoder& dec, stages::Sampler& sampler, int n_draft, int max_tokens, SpecStats& stats,
                     const EmitFn& emit, const DraftFn& drafter = {}, DraftPolicy* policy = nullptr);

}  // namespace k3::pipeline
