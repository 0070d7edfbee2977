// pipeline/run/draft_policy.*: when a speculative decode drafts and how many. Its decisions on fixed
// id sequences (the minimum match, k growing and shrinking with acceptance, the pauses and their
// doubling and reset), and a decode simulated without a model -- the "model" emits a fixed id
// sequence, a draft is accepted while it equals the next id -- where the worst case (ids that never
// repeat in a way lookup can use) must cost close to plain decoding in rows fed, and a sequence that
// repeats itself must still be decoded in few passes. The flags' refusals name the flag (exit 2).
#include <doctest/doctest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "io/error.hpp"
#include "pipeline/run/draft_policy.hpp"
#include "pipeline/run/speculative.hpp"

using k3::pipeline::DraftPolicy;
using k3::pipeline::DraftPolicyOptions;

namespace {

using Ids = std::vector<int32_t>;

DraftPolicyOptions adaptive(size_t n, size_t min_match = 2) {
  DraftPolicyOptions o;
  o.max_drafts = n;
  o.min_match = min_match;
  return o;
}

// 1..5 twice then 1, 2: a 2-id match ("1 2") proposes 3, 4, 5, 1, 2.
const Ids kRepeat = {1, 2, 3, 4, 5, 1, 2, 3, 4, 5, 1, 2};

struct Sim {
  uint64_t passes = 0, rows = 0, drafted = 0, accepted = 0, tokens = 0;
};

// Decodes `truth` from position `start` (truth[0..start] is the prompt, its last id pending) with
// `p`'s drafts: one pass feeds the pending id and the drafts; the drafts are accepted while each is
// the next id of `truth`; the pass emits accepted + 1 ids, as speculative_step does.
Sim simulate(DraftPolicy& p, const Ids& truth, size_t start) {
  Sim s;
  Ids seq(truth.begin(), truth.begin() + std::ptrdiff_t(start));
  while (seq.size() < truth.size()) {
    const size_t left = truth.size() - seq.size();
    const Ids d = p.propose(seq, left - 1);
    REQUIRE(d.size() <= left - 1);
    size_t a = 0;
    while (a < d.size() && d[a] == truth[seq.size() + a]) ++a;
    for (size_t i = 0; i <= a; ++i) seq.push_back(truth[seq.size()]);
    p.observe(d.size(), a, a + 1);
    ++s.passes;
    s.rows += 1 + d.size();
    s.drafted += d.size();
    s.accepted += a;
    s.tokens += a + 1;
  }
  return s;
}

// Ids of a small vocabulary from a fixed LCG: 1-id matches on most steps, longer ones now and then,
// no structure a draft could use.
Ids random_ids(size_t n, uint32_t vocab, uint32_t seed) {
  Ids v;
  uint64_t x = seed;
  for (size_t i = 0; i < n; ++i) {
    x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    v.push_back(int32_t((x >> 33) % vocab));
  }
  return v;
}

}  // namespace

TEST_CASE("draft_lookup's min_match: shorter matches draft nothing") {
  // The tail "3" occurs earlier (followed by 9) but "5 3" does not.
  const Ids s = {1, 3, 9, 7, 5, 3};
  CHECK(k3::pipeline::draft_lookup(s, 2, 3, 1) == Ids{9, 7});
  CHECK(k3::pipeline::draft_lookup(s, 2, 3, 2).empty());
  // A 3-id match drafts under min_match 3; a min_match above the n-gram bound finds nothing.
  CHECK(k3::pipeline::draft_lookup(kRepeat, 3, 3, 3) == Ids{3, 4, 5});
  CHECK(k3::pipeline::draft_lookup(kRepeat, 3, 3, 4).empty());
  CHECK(k3::pipeline::draft_lookup(kRepeat, 3, 4, 4) == Ids{3, 4, 5});
}

TEST_CASE("DraftPolicy: a match of min_match ids, k from 1 growing with acceptance") {
  DraftPolicy p(adaptive(4));
  CHECK(p.propose(Ids{1, 3, 9, 7, 5, 3}, 4).empty());  // a 1-id match only
  CHECK(p.next_drafts() == 1);
  CHECK(p.propose(kRepeat, 4) == Ids{3});
  p.observe(1, 1, 2);  // all accepted: k doubles
  CHECK(p.next_drafts() == 2);
  CHECK(p.propose(kRepeat, 4) == Ids{3, 4});
  p.observe(2, 2, 3);
  CHECK(p.next_drafts() == 4);
  p.observe(4, 4, 5);
  CHECK(p.next_drafts() == 4);                // capped at N
  CHECK(p.propose(kRepeat, 2) == Ids{3, 4});  // and at the tokens still wanted
  p.observe(4, 1, 2);                         // one of four: accepted + 1
  CHECK(p.next_drafts() == 2);
  p.observe(2, 0, 1);  // none: back to 1, no pause yet (one rejected pass)
  CHECK(p.next_drafts() == 1);
  CHECK(p.pause_left() == 0);
  CHECK(p.pauses() == 0);
  // Min match 1: the 1-id match drafts.
  DraftPolicy q(adaptive(4, 1));
  CHECK(q.propose(Ids{1, 3, 9, 7, 5, 3}, 4) == Ids{9});
}

TEST_CASE("DraftPolicy: pauses after rejected passes, doubling, reset by an accepted draft") {
  DraftPolicyOptions o = adaptive(4);
  o.reject_streak = 2;
  o.backoff_tokens = 3;
  o.backoff_max = 8;
  DraftPolicy p(o);
  p.observe(1, 0, 1);
  CHECK(p.pause_left() == 0);
  p.observe(1, 0, 1);  // the second in a row: a pause of 3 tokens
  CHECK(p.pauses() == 1);
  CHECK(p.pause_left() == 3);
  for (int i = 0; i < 3; ++i) {
    CHECK(p.propose(kRepeat, 4).empty());  // a match, but paused
    p.observe(0, 0, 1);
  }
  CHECK(p.pause_left() == 0);
  CHECK(p.paused_tokens() == 3);
  CHECK(p.propose(kRepeat, 4) == Ids{3});  // resumes at the next match
  p.observe(1, 0, 1);                      // one more rejection: the next pause, twice as long
  CHECK(p.pauses() == 2);
  CHECK(p.pause_left() == 6);
  p.observe(0, 0, 4);  // a pause counts tokens, not passes
  CHECK(p.pause_left() == 2);
  p.observe(0, 0, 2);
  p.observe(1, 0, 1);
  CHECK(p.pause_left() == 8);  // 12, capped at backoff_max
  for (int i = 0; i < 8; ++i) p.observe(0, 0, 1);
  CHECK(p.paused_tokens() == 3 + 6 + 8);
  p.observe(1, 1, 2);  // accepted: the streak and the pause length reset
  p.observe(2, 0, 1);
  CHECK(p.pause_left() == 0);  // one rejection is not a streak again
  p.observe(1, 0, 1);
  CHECK(p.pause_left() == 3);
  CHECK(p.pauses() == 4);
}

TEST_CASE("DraftPolicy fixed: N drafts at every match, never a pause") {
  DraftPolicyOptions o = adaptive(4, 1);
  o.adaptive = false;
  DraftPolicy p(o);
  for (int i = 0; i < 10; ++i) {
    CHECK(p.propose(kRepeat, 8) == Ids{3, 4, 5, 1});
    p.observe(4, 0, 1);
  }
  CHECK(p.pauses() == 0);
  CHECK(p.pause_left() == 0);
}

TEST_CASE("DraftPolicy simulated: ids lookup cannot predict cost close to plain; repeats still pay") {
  // The worst case: 1000 ids of a 64-id vocabulary, nothing to predict. The fixed policy at min
  // match 1 (the drafter before the policy) feeds several rows per token; the adaptive one at most
  // a few percent more than plain decoding's one.
  const Ids noise = random_ids(1000, 64, 7);
  DraftPolicyOptions fixed = adaptive(4, 1);
  fixed.adaptive = false;
  DraftPolicy f(fixed);
  const Sim sf = simulate(f, noise, 8);
  DraftPolicy a(adaptive(4));
  const Sim sa = simulate(a, noise, 8);
  INFO("fixed: ", sf.rows, " rows, ", sf.drafted, " drafted, ", sf.accepted, " accepted; adaptive: ", sa.rows,
       " rows, ", sa.drafted, " drafted, ", sa.accepted, " accepted, ", a.pauses(), " pauses");
  CHECK(sf.tokens == 992);
  CHECK(sa.tokens == 992);
  CHECK(double(sf.rows) > 3.0 * double(sf.tokens));
  CHECK(double(sa.rows) < 1.05 * double(sa.tokens));
  CHECK(sa.drafted * 20 < sf.drafted);
  CHECK(a.pauses() >= 2);
  // A model that repeats a 40-id passage: after the first copy, lookup knows the rest. The adaptive
  // policy reaches N drafts a pass within a few passes: close to the fixed policy's passes.
  const Ids passage = random_ids(40, 1000, 11);
  Ids rep;
  for (int i = 0; i < 10; ++i) rep.insert(rep.end(), passage.begin(), passage.end());
  DraftPolicy f2(fixed), a2(adaptive(4));
  const Sim rf = simulate(f2, rep, 41);
  const Sim ra = simulate(a2, rep, 41);
  INFO("repeat: fixed ", rf.passes, " passes, adaptive ", ra.passes, " passes");
  CHECK(ra.tokens == rep.size() - 41);
  CHECK(ra.accepted == ra.drafted);
  CHECK(double(ra.passes) < 1.05 * double(rf.passes) + 3);
  CHECK(double(ra.tokens) / double(ra.passes) > 4.5);  // close to N + 1 = 5 a pass
  CHECK(a2.pauses() == 0);
}

TEST_CASE("--spec-min-match and --spec-policy: validated, each naming its flag") {
  using k3::pipeline::spec_policy_options;
  const auto usage = [](auto f, const std::string& flag) {
    try {
      f();
      FAIL("no error for ", flag);
    } catch (const k3::io::Error& e) {
      CHECK(e.kind() == k3::io::ErrorKind::usage);
      CHECK(std::string(e.what()).find(flag) != std::string::npos);
    }
  };
  usage([] { spec_policy_options(4, 0, std::nullopt); }, "--spec-min-match 0");
  usage([] { spec_policy_options(4, 17, std::nullopt); }, "--spec-min-match 17");
  usage([] { spec_policy_options(0, 2, std::nullopt); }, "--spec-min-match");
  usage([] { spec_policy_options(4, std::nullopt, std::string("greedy")); }, "--spec-policy greedy");
  usage([] { spec_policy_options(0, std::nullopt, std::string("fixed")); }, "--spec-policy");
  const DraftPolicyOptions d = spec_policy_options(4, std::nullopt, std::nullopt);
  CHECK(d.min_match == 2);
  CHECK(d.adaptive);
  CHECK(d.max_drafts == 4);
  const DraftPolicyOptions f = spec_policy_options(8, 5, std::string("fixed"));
  CHECK(f.min_match == 5);
  CHECK(!f.adaptive);
}
