// When and how much a speculative decode drafts (docs/speculative.md, "The drafting policy"). A
// verify pass of k drafts on a resident, compute-bound model costs about k + 1 one-token steps, so
// drafts the model rejects are not free: the policy keeps the worst case (nothing ever accepted)
// close to plain decoding and the good case (drafts accepted) close to the full N per pass.
//   - a draft needs a match of at least `min_match` ids (--spec-min-match): a 1-id match in a small
//     vocabulary is mostly chance;
//   - how many: k starts at 1, doubles (up to N) after a pass whose drafts were all accepted and
//     becomes accepted + 1 after one that rejected some (1 when none was accepted);
//   - back-off: after `reject_streak` verify passes in a row with nothing accepted, no drafting for
//     `backoff_tokens` tokens; each further fully-rejected pass before a draft is accepted again
//     doubles the pause (up to `backoff_max`). After a pause, drafting resumes at the next match of
//     at least min_match ids; an accepted draft resets the streak and the pause length.
// The policy only chooses which drafts are proposed: the ids and logits stay plain greedy decoding's
// whatever it does. `fixed` is the policy before it: N drafts whenever a match is found.
#pragma once
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace k3::pipeline {

inline constexpr int kDefaultMinMatch = 2;  // --spec-min-match's default
inline constexpr int kMaxMinMatch = 16;     // --spec-min-match 1..16

struct DraftPolicyOptions {
  size_t max_drafts = 0;  // N (--spec)
  size_t min_match = size_t(kDefaultMinMatch);
  bool adaptive = true;  // false: the fixed policy (N drafts at every match, no back-off)
  uint32_t reject_streak = 2;
  uint32_t backoff_tokens = 8;
  uint32_t backoff_max = 512;
};

// "adaptive" or "fixed" (--spec-policy); anything else is a usage error (exit 2) naming the flag.
bool parse_spec_policy(const std::string& name);

class DraftPolicy {
 public:
  explicit DraftPolicy(const DraftPolicyOptions& o);

  // The drafts for the next pass after `seq` (its last id the pending one), at most `cap`: empty
  // during a pause, without a match of min_match ids, or when cap is 0.
  std::vector<int32_t> propose(std::span<const int32_t> seq, size_t cap);
  // What the pass did: `drafted` drafts (0: a plain step), `accepted` of them; `emitted` tokens.
  void observe(size_t drafted, size_t accepted, size_t emitted);

  const DraftPolicyOptions& options() const { return o_; }
  size_t next_drafts() const { return k_; }                  // the k of the next verify pass (before the cap)
  uint64_t pause_left() const { return left_; }              // tokens still to decode without drafting
  uint64_t pauses() const { return pauses_; }                // pauses started so far
  uint64_t paused_tokens() const { return paused_tokens_; }  // tokens decoded while paused

 private:
  DraftPolicyOptions o_;
  size_t k_;
  uint32_t streak_ = 0;  // verify passes in a row with nothing accepted
  uint64_t next_pause_;  // the length of the next pause
  uint64_t left_ = 0;
  uint64_t pauses_ = 0, paused_tokens_ = 0;
};

}  // namespace k3::pipeline
