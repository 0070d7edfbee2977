#include "pipeline/run/draft_policy.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "io/error.hpp"
#include "pipeline/run/speculative.hpp"

namespace k3::pipeline {

bool parse_spec_policy(const std::string& name) {
  if (name == "adaptive") return true;
  if (name == "fixed") return false;
  throw io::usage_error(fmt::format("--spec-policy {}: must be adaptive or fixed", name));
}

DraftPolicy::DraftPolicy(const DraftPolicyOptions& o)
    : o_(o),
      k_(o.adaptive ? std::min<size_t>(1, o.max_drafts) : o.max_drafts),
      next_pause_(o.backoff_tokens) {
  o_.min_match = std::max<size_t>(1, o_.min_match);
  o_.reject_streak = std::max<uint32_t>(1, o_.reject_streak);
}

std::vector<int32_t> DraftPolicy::propose(std::span<const int32_t> seq, size_t cap) {
  if (left_ > 0) return {};
  const size_t n = std::min(k_, cap);
  return draft_lookup(seq, n, std::max(kDraftMaxNgram, o_.min_match), o_.min_match);
}

void DraftPolicy::observe(size_t drafted, size_t accepted, size_t emitted) {
  if (!o_.adaptive) return;
  if (left_ > 0) {
    const uint64_t e = std::min<uint64_t>(left_, emitted);
    left_ -= e;
    paused_tokens_ += e;
  }
  if (drafted == 0) return;
  if (accepted > 0) {
    streak_ = 0;
    next_pause_ = o_.backoff_tokens;
    k_ = accepted >= drafted ? std::min(o_.max_drafts, 2 * std::max(k_, drafted)) : accepted + 1;
    k_ = std::min(k_, o_.max_drafts);
    return;
  }
  k_ = std::min<size_t>(1, o_.max_drafts);
  if (++streak_ < o_.reject_streak) return;
  // A pause; one more fully-rejected pass after it starts the next, twice as long.
  left_ = next_pause_;
  next_pause_ = std::min<uint64_t>(o_.backoff_max, 2 * next_pause_);
  ++pauses_;
  streak_ = o_.reject_streak - 1;
}

}  // namespace k3::pipeline
