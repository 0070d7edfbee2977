// Next-token selection from a logits row: greedy by default, or a seeded draw after a fixed chain
// of truncations. Every step is plain sequential scalar code so the chosen id depends only on the
// logits, the context and the options -- never on thread count, ISA or libm variant. docs/sampling.md
// states the definition this file implements.
#pragma once
#include <cstdint>
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
  uint64_t seed = 0;
};

// Throws io::Error (usage) naming the offending flag (--temperature, --top-k, --top-p, --min-p,
// --repeat-penalty, --repeat-last-n).
void validate(const SamplerOptions&);

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

class Sampler {
 public:
  explicit Sampler(SamplerOptions);  // validates

  // context: every id so far (prompt + generated), for the repeat penalty. Throws io::Error
  // (runtime) for empty logits, a penalised context id outside the logits, or -- when drawing --
  // a NaN or +inf logit or no logit above -inf.
  int32_t next(std::span<const float> logits, std::span<const int32_t> context);

  const SamplerOptions& options() const { return opt_; }

 private:
  struct Candidate {
    float logit;
    int32_t id;
  };
  std::span<const float> penalised(std::span<const float> logits, std::span<const int32_t> context);
  int32_t draw(std::span<const float> logits);

  SamplerOptions opt_;
  Xoshiro256ss rng_;
  std::vector<float> work_;  // the penalised copy of the logits
  std::vector<Candidate> cand_;
  std::vector<double> prob_;
};

}  // namespace k3::stages
