// Next-token selection from a logits row: greedy by default, or a seeded draw after a fixed chain
// of truncations. Every step is plain sequential scalar code so the chosen id depends only on the
// logits, the context and the options -- never on thread count, ISA or libm variant. docs/sampling.md
// states the definition this file implements.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

namespace k3::stages {

struct SamplerOptions {
  double temperature = 0;  // 0: greedy (no random numbers used)
  int top_k = 0;           // 0: off
  double top_p = 1;        // 1: off
  double min_p = 0;        // 0: off
  double repeat_penalty = 1;
  int repeat_last_n = 64;  // 0: no penalty
  // OpenAI's penalties over the generated ids: logit -= presence * [count > 0] + frequency * count.
  double presence_penalty = 0;   // [-2, 2]; 0: off
  double frequency_penalty = 0;  // [-2, 2]; 0: off
  uint64_t seed = 0;
};

// Throws io::Error (usage) naming the offending flag (--temperature, --top-k, --top-p, --min-p,
// --repeat-penalty, --repeat-last-n, --presence-penalty, --frequency-penalty).
void validate(const SamplerOptions&);

// Restricts which ids may come next (stages/json_constraint.hpp): the sampler sets every other
// logit to -inf first, and reports each chosen id back.
class TokenConstraint {
 public:
  virtual ~TokenConstraint() = default;
  // Bit id (word id / 64, bit id % 64) set: id may come next. Never all clear.
  virtual std::span<const uint64_t> allowed(size_t vocab) = 0;
  virtual void accept(int32_t id) = 0;
  // Nothing more may be generated (the caller ends the generation as at an end id).
  virtual bool done() const = 0;
};

// SplitMix64 (Steele, Lea & Flood 2014; constants from Vigna's splitmix64.c): used only to expand
// the 64-bit seed into xoshiro's 256-bit state, as the xoshiro authors recommend.
uint64_t splitmix64(uint64_t& state);

// xoshiro256** 1.0 (Blackman & Vigna, "Scrambled linear pseudorandom number generators", 2018;
// reference code xoshiro256starstar.c at prng.di.unimi.it).
class Xoshiro256ss {
 public:
  explicit Xoshiro256ss(uint64_t seed);  // state = four successive splitmix64 outputs from `seed`
  static Xoshiro256ss from_state(const uint64_t (&s)[4]);
  uint64_t next();
  // The top 53 bits as a double in [0, 1): every value is a multiple of 2^-53.
  double uniform();

 private:
  Xoshiro256ss() = default;
  uint64_t s_[4] = {};
};

// e^x for x <= 0 (and -inf -> 0) from IEEE + - * / and ldexp only, so the sampler's softmax gives
// the same bits on every machine (glibc picks an FMA or a plain exp at run time, and the two may
// differ in the last place). Within a few ulp of the true value; monotonicity is not promised.
double exp_nonpositive(double x);

// llama.cpp's repeat penalty, in place: each distinct id among the last `last_n` of `context` is
// penalised once -- logit > 0 becomes logit / penalty, otherwise logit * penalty (in double,
// rounded back to float). Throws io::Error (runtime) for a window id outside `logits`.
void apply_repeat_penalty(std::span<float> logits, std::span<const int32_t> context, double penalty,
                          int last_n);

// OpenAI's presence / frequency penalties, in place: for each distinct id among `generated`, with c
// its count there, logit = float(double(logit) - (presence * [c > 0] + frequency * c)). Ids are
// visited in ascending order. Throws io::Error (runtime) for an id outside `logits`.
void apply_presence_frequency(std::span<float> logits, std::span<const int32_t> generated, double presence,
                              double frequency);

// The model's log-probabilities from one logits row: log-softmax in double, max-subtracted, the
// exponentials (exp_nonpositive) summed sequentially in id order. -inf logits give -inf.
struct TopLogprob {
  int32_t id;
  double logprob;
};
struct TokenLogprob {
  int32_t id;
  double logprob;
  std::vector<TopLogprob> top;  // the `top_n` most likely ids, by logit descending, ties by lower id
};
TokenLogprob token_logprob(std::span<const float> logits, int32_t id, int top_n);

class Sampler {
 public:
  explicit Sampler(SamplerOptions);  // validates

  // context: every id so far (prompt + generated), for the penalties. Throws io::Error (runtime)
  // for empty logits, a penalised context id outside the logits, a constraint that leaves no id
  // with a logit above -inf, or -- when drawing -- a NaN or +inf logit or no logit above -inf.
  int32_t next(std::span<const float> logits, std::span<const int32_t> context);

  // Where the generated ids begin in the contexts next() is given (the presence / frequency
  // penalties count only those). Unset, it is the first context's length: everything before the
  // first draw is prompt.
  void start_reply(size_t context_length) { reply_start_ = context_length; }
  // Constrains every following draw (null: none).
  void set_constraint(std::unique_ptr<TokenConstraint> c) { constraint_ = std::move(c); }
  TokenConstraint* constraint() const { return constraint_.get(); }

  const SamplerOptions& options() const { return opt_; }

 private:
  struct Candidate {
    float logit;
    int32_t id;
  };
  std::span<const float> prepared(std::span<const float> logits, std::span<const int32_t> context);
  int32_t draw(std::span<const float> logits);

  SamplerOptions opt_;
  Xoshiro256ss rng_;
  std::vector<float> work_;  // the penalised copy of the logits
  std::vector<Candidate> cand_;
  std::vector<double> prob_;
  size_t reply_start_ = SIZE_MAX;
  std::unique_ptr<TokenConstraint> constraint_;
};

}  // namespace k3::stages
