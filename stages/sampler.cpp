#include "stages/sampler.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>

#include "io/error.hpp"
#include "stages/head.hpp"

namespace k3::stages {

void validate(const SamplerOptions& o) {
  if (!std::isfinite(o.temperature) || o.temperature < 0)
    throw io::usage_error(fmt::format("--temperature must be a finite number >= 0 (got {})", o.temperature));
  if (o.top_k < 0) throw io::usage_error(fmt::format("--top-k must be >= 0 (got {})", o.top_k));
  if (!(o.top_p > 0 && o.top_p <= 1))
    throw io::usage_error(fmt::format("--top-p must be in (0, 1] (got {})", o.top_p));
  if (!(o.min_p >= 0 && o.min_p < 1))
    throw io::usage_error(fmt::format("--min-p must be in [0, 1) (got {})", o.min_p));
  if (!std::isfinite(o.repeat_penalty) || o.repeat_penalty <= 0)
    throw io::usage_error(
        fmt::format("--repeat-penalty must be a finite number > 0 (got {})", o.repeat_penalty));
  if (o.repeat_last_n < 0)
    throw io::usage_error(fmt::format("--repeat-last-n must be >= 0 (got {})", o.repeat_last_n));
  if (!(o.presence_penalty >= -2 && o.presence_penalty <= 2))
    throw io::usage_error(fmt::format("--presence-penalty must be in [-2, 2] (got {})", o.presence_penalty));
  if (!(o.frequency_penalty >= -2 && o.frequency_penalty <= 2))
    throw io::usage_error(
        fmt::format("--frequency-penalty must be in [-2, 2] (got {})", o.frequency_penalty));
}

uint64_t splitmix64(uint64_t& state) {
  state += 0x9e3779b97f4a7c15ULL;
  uint64_t z = state;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

namespace {
constexpr uint64_t rotl(uint64_t x, int k) {
  return (x << k) | (x >> (64 - k));
}
}  // namespace

Xoshiro256ss::Xoshiro256ss(uint64_t seed) {
  // Four distinct SplitMix64 inputs give four outputs of a bijection, so the state is never all
  // zero (the one state xoshiro cannot leave).
  for (uint64_t& w : s_) w = splitmix64(seed);
}

Xoshiro256ss Xoshiro256ss::from_state(const uint64_t (&s)[4]) {
  Xoshiro256ss r;
  std::copy(std::begin(s), std::end(s), std::begin(r.s_));
  return r;
}

uint64_t Xoshiro256ss::next() {
  const uint64_t result = rotl(s_[1] * 5, 7) * 9;
  const uint64_t t = s_[1] << 17;
  s_[2] ^= s_[0];
  s_[3] ^= s_[1];
  s_[1] ^= s_[2];
  s_[0] ^= s_[3];
  s_[2] ^= t;
  s_[3] = rotl(s_[3], 45);
  return result;
}

double Xoshiro256ss::uniform() {
  return static_cast<double>(next() >> 11) * 0x1.0p-53;
}

namespace {

// 1/n! for n = 0..13, each the rounded quotient of the previous one by n (fixed at compile time).
constexpr int kExpDegree = 13;
constexpr auto kInvFactorial = [] {
  std::array<double, kExpDegree + 1> c{};
  c[0] = 1.0;
  for (int n = 1; n <= kExpDegree; ++n) c[n] = c[n - 1] / n;
  return c;
}();

}  // namespace

double exp_nonpositive(double x) {
  // Below this e^x is under half the smallest subnormal and rounds to 0 anyway.
  if (!(x > -745.2)) return 0.0;
  // x = k ln2 + r, |r| <= ln2/2. ln2 is split (fdlibm's hi/lo) so that k * hi is exact for
  // |k| < 2^21, leaving r accurate to a few ulp.
  constexpr double kLog2e = 1.4426950408889634;
  constexpr double kLn2Hi = 6.93147180369123816490e-01;
  constexpr double kLn2Lo = 1.90821492927058770002e-10;
  const double k = std::nearbyint(x * kLog2e);
  const double r = (x - k * kLn2Hi) - k * kLn2Lo;
  // Taylor series to r^13: the truncation term is below 2^-60 for |r| <= 0.35.
  double p = kInvFactorial[kExpDegree];
  for (int n = kExpDegree - 1; n >= 0; --n) p = p * r + kInvFactorial[n];
  return std::ldexp(p, static_cast<int>(k));
}

void apply_repeat_penalty(std::span<float> logits, std::span<const int32_t> context, double penalty,
                          int last_n) {
  const size_t n = std::min(context.size(), static_cast<size_t>(std::max(last_n, 0)));
  std::vector<int32_t> window(context.end() - static_cast<std::ptrdiff_t>(n), context.end());
  std::sort(window.begin(), window.end());
  window.erase(std::unique(window.begin(), window.end()), window.end());
  for (int32_t id : window) {
    if (id < 0 || static_cast<size_t>(id) >= logits.size())
      throw io::runtime_error(fmt::format("sampler: context id {} outside the logits 0..{}", id,
                                          static_cast<int64_t>(logits.size()) - 1));
    const double l = logits[static_cast<size_t>(id)];
    logits[static_cast<size_t>(id)] = static_cast<float>(l > 0 ? l / penalty : l * penalty);
  }
}

void apply_presence_frequency(std::span<float> logits, std::span<const int32_t> generated, double presence,
                              double frequency) {
  std::vector<int32_t> sorted(generated.begin(), generated.end());
  std::sort(sorted.begin(), sorted.end());
  for (size_t i = 0; i < sorted.size();) {
    size_t j = i;
    while (j < sorted.size() && sorted[j] == sorted[i]) ++j;
    const int32_t id = sorted[i];
    if (id < 0 || static_cast<size_t>(id) >= logits.size())
      throw io::runtime_error(fmt::format("sampler: generated id {} outside the logits 0..{}", id,
                                          static_cast<int64_t>(logits.size()) - 1));
    const double count = static_cast<double>(j - i);
    const double penalty = presence + frequency * count;
    logits[static_cast<size_t>(id)] =
        static_cast<float>(static_cast<double>(logits[static_cast<size_t>(id)]) - penalty);
    i = j;
  }
}

TokenLogprob token_logprob(std::span<const float> logits, int32_t id, int top_n) {
  if (logits.empty()) throw io::runtime_error("sampler: empty logits row");
  if (id < 0 || static_cast<size_t>(id) >= logits.size())
    throw io::runtime_error(fmt::format("sampler: id {} outside the logits", id));
  double top = -std::numeric_limits<double>::infinity();
  for (float x : logits) top = std::max(top, static_cast<double>(x));
  double sum = 0;
  for (float x : logits) sum += exp_nonpositive(static_cast<double>(x) - top);
  const double log_sum = std::log(sum);
  const auto lp = [&](size_t i) {
    const double x = logits[i];
    return x == -std::numeric_limits<double>::infinity() ? x : (x - top) - log_sum;
  };
  TokenLogprob r{id, lp(static_cast<size_t>(id)), {}};
  const size_t n = std::min(logits.size(), static_cast<size_t>(std::max(top_n, 0)));
  if (n == 0) return r;
  std::vector<int32_t> ids(logits.size());
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>(i);
  std::partial_sort(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(n), ids.end(),
                    [&](int32_t a, int32_t b) {
                      const float la = logits[static_cast<size_t>(a)], lb = logits[static_cast<size_t>(b)];
                      return la > lb || (la == lb && a < b);
                    });
  for (size_t i = 0; i < n; ++i) r.top.push_back({ids[i], lp(static_cast<size_t>(ids[i]))});
  return r;
}

Sampler::Sampler(SamplerOptions o) : opt_(o), rng_(o.seed) {
  validate(opt_);
}

std::span<const float> Sampler::prepared(std::span<const float> logits, std::span<const int32_t> context) {
  const bool repeat = opt_.repeat_penalty != 1 && opt_.repeat_last_n != 0 && !context.empty();
  const bool openai = opt_.presence_penalty != 0 || opt_.frequency_penalty != 0;
  if (!constraint_ && !repeat && !openai) return logits;
  work_.assign(logits.begin(), logits.end());
  // 1. the constraint's mask, 2. the repeat penalty, 3. presence / frequency (docs/sampling.md).
  if (constraint_) {
    const std::span<const uint64_t> bits = constraint_->allowed(work_.size());
    for (size_t i = 0; i < work_.size(); ++i)
      if (!((bits[i / 64] >> (i % 64)) & 1)) work_[i] = -std::numeric_limits<float>::infinity();
  }
  if (repeat) apply_repeat_penalty(work_, context, opt_.repeat_penalty, opt_.repeat_last_n);
  if (openai) {
    if (reply_start_ == SIZE_MAX) reply_start_ = context.size();
    const size_t from = std::min(reply_start_, context.size());
    apply_presence_frequency(work_, context.subspan(from), opt_.presence_penalty, opt_.frequency_penalty);
  }
  return work_;
}

int32_t Sampler::next(std::span<const float> logits, std::span<const int32_t> context) {
  if (logits.empty()) throw io::runtime_error("sampler: empty logits row");
  if (reply_start_ == SIZE_MAX) reply_start_ = context.size();
  const std::span<const float> l = prepared(logits, context);
  const int32_t id = opt_.temperature == 0 ? greedy(l) : draw(l);
  if (constraint_) {
    if (l[static_cast<size_t>(id)] == -std::numeric_limits<float>::infinity())
      throw io::runtime_error("sampler: no id the constraint allows has a logit above -inf");
    constraint_->accept(id);
  }
  return id;
}

int32_t Sampler::draw(std::span<const float> logits) {
  const size_t V = logits.size();
  cand_.resize(V);
  for (size_t i = 0; i < V; ++i) {
    const float x = logits[i];
    if (std::isnan(x) || x == std::numeric_limits<float>::infinity())
      throw io::runtime_error(fmt::format("sampler: logit {} is {}", i, x));
    cand_[i] = Candidate{x, static_cast<int32_t>(i)};
  }

  // A strict total order (ids are distinct), so a partial sort's prefix is exactly the full
  // sort's prefix.
  const auto before = [](const Candidate& a, const Candidate& b) {
    return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
  };
  size_t n = V;
  if (opt_.top_k > 0 && static_cast<size_t>(opt_.top_k) < V) {
    n = static_cast<size_t>(opt_.top_k);
    std::partial_sort(cand_.begin(), cand_.begin() + static_cast<std::ptrdiff_t>(n), cand_.end(), before);
  } else {
    std::sort(cand_.begin(), cand_.end(), before);
  }
  if (cand_[0].logit == -std::numeric_limits<float>::infinity())
    throw io::runtime_error("sampler: every logit is -inf");

  // Softmax of logit / T, max-subtracted: the difference is taken before dividing so a tiny T
  // sends it to -inf (weight 0) rather than overflowing to inf - inf.
  const double T = opt_.temperature, top = cand_[0].logit;
  prob_.resize(n);
  double sum = 0;
  for (size_t i = 0; i < n; ++i) {
    prob_[i] = exp_nonpositive((static_cast<double>(cand_[i].logit) - top) / T);
    sum += prob_[i];
  }
  for (size_t i = 0; i < n; ++i) prob_[i] /= sum;

  if (opt_.top_p < 1) {
    double cum = 0;
    for (size_t i = 0; i < n; ++i) {
      cum += prob_[i];
      if (cum >= opt_.top_p) {
        n = i + 1;
        break;
      }
    }
  }

  if (opt_.min_p > 0) {
    double pmax = 0;
    for (size_t i = 0; i < n; ++i) pmax = std::max(pmax, prob_[i]);
    const double threshold = opt_.min_p * pmax;
    size_t kept = 0;
    for (size_t i = 0; i < n; ++i) {
      if (prob_[i] >= threshold) {
        cand_[kept] = cand_[i];
        prob_[kept] = prob_[i];
        ++kept;
      }
    }
    n = kept;
  }

  double kept_sum = 0;
  for (size_t i = 0; i < n; ++i) kept_sum += prob_[i];
  const double u = rng_.uniform();
  double acc = 0;
  for (size_t i = 0; i < n; ++i) {
    acc += prob_[i] / kept_sum;
    if (u < acc) return cand_[i].id;
  }
  // Rounding left the cumulative sum just below u: the last kept candidate that has any weight
  // (a -inf logit, masked by a constraint, has none).
  size_t last = n - 1;
  while (last > 0 && prob_[last] == 0) --last;
  return cand_[last].id;
}

}  // namespace k3::stages
