#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "io/error.hpp"
#include "stages/head.hpp"
#include "stages/sampler.hpp"

using k3::stages::Sampler;
using k3::stages::SamplerOptions;

namespace {

std::vector<float> random_logits(std::mt19937& g, size_t n, float scale = 4.0f) {
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(g);
  return v;
}

// Logits rounded to a coarse grid, so many ids tie.
std::vector<float> tied_logits(std::mt19937& g, size_t n) {
  std::vector<float> v = random_logits(g, n, 2.0f);
  for (float& x : v) x = std::round(x * 2.0f) / 2.0f;
  return v;
}

// The definition in docs/sampling.md written out the plain way: a full sort, every step a loop.
// Shares only the RNG and the exp with the sampler; both are checked on their own below.
class ReferenceSampler {
 public:
  explicit ReferenceSampler(SamplerOptions o) : o_(o), rng_(o.seed) {}

  int32_t next(std::vector<float> l, const std::vector<int32_t>& context) {
    if (o_.repeat_penalty != 1 && o_.repeat_last_n > 0) {
      std::set<int32_t> window;
      const size_t from = context.size() > static_cast<size_t>(o_.repeat_last_n)
                              ? context.size() - static_cast<size_t>(o_.repeat_last_n)
                              : 0;
      for (size_t i = from; i < context.size(); ++i) window.insert(context[i]);
      for (int32_t id : window) {
        const double x = l[static_cast<size_t>(id)];
        l[static_cast<size_t>(id)] =
            static_cast<float>(x > 0 ? x / o_.repeat_penalty : x * o_.repeat_penalty);
      }
    }
    if (o_.temperature == 0) {
      size_t best = 0;
      for (size_t i = 1; i < l.size(); ++i)
        if (l[i] > l[best]) best = i;
      return static_cast<int32_t>(best);
    }
    std::vector<int32_t> order(l.size());
    for (size_t i = 0; i < l.size(); ++i) order[i] = static_cast<int32_t>(i);
    std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
      if (l[a] != l[b]) return l[a] > l[b];
      return a < b;
    });
    if (o_.top_k > 0 && static_cast<size_t>(o_.top_k) < order.size()) order.resize(o_.top_k);
    std::vector<double> p;
    double sum = 0;
    for (int32_t id : order) {
      p.push_back(k3::stages::exp_nonpositive((double(l[id]) - double(l[order[0]])) / o_.temperature));
      sum += p.back();
    }
    for (double& x : p) x = x / sum;
    if (o_.top_p < 1) {
      double cum = 0;
      size_t keep = p.size();
      for (size_t i = 0; i < p.size(); ++i) {
        cum += p[i];
        if (cum >= o_.top_p) {
          keep = i + 1;
          break;
        }
      }
      order.resize(keep);
      p.resize(keep);
    }
    if (o_.min_p > 0) {
      const double pmax = *std::max_element(p.begin(), p.end());
      std::vector<int32_t> o2;
      std::vector<double> p2;
      for (size_t i = 0; i < p.size(); ++i)
        if (p[i] >= o_.min_p * pmax) {
          o2.push_back(order[i]);
          p2.push_back(p[i]);
        }
      order = o2;
      p = p2;
    }
    double total = 0;
    for (double x : p) total += x;
    std::vector<double> q;
    for (double x : p) q.push_back(x / total);
    const double u = static_cast<double>(rng_.next() >> 11) / 9007199254740992.0;
    double acc = 0;
    for (size_t i = 0; i < q.size(); ++i) {
      acc += q[i];
      if (u < acc) return order[i];
    }
    return order.back();
  }

 private:
  SamplerOptions o_;
  k3::stages::Xoshiro256ss rng_;
};

std::string usage_message(const SamplerOptions& o) {
  try {
    k3::stages::validate(o);
  } catch (const k3::io::Error& e) {
    CHECK(e.kind() == k3::io::ErrorKind::usage);
    return e.what();
  }
  return "";
}

// Exact probabilities of the definition, in long double with the libm exp (a different route to
// the same numbers, good to far better than the sampling noise tested against).
std::map<int32_t, double> exact_distribution(const std::vector<float>& l, const SamplerOptions& o) {
  std::vector<int32_t> order(l.size());
  for (size_t i = 0; i < l.size(); ++i) order[i] = static_cast<int32_t>(i);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return l[a] > l[b]; });
  if (o.top_k > 0 && static_cast<size_t>(o.top_k) < order.size()) order.resize(o.top_k);
  std::vector<long double> p;
  long double s = 0;
  for (int32_t id : order) {
    p.push_back(std::exp((static_cast<long double>(l[id]) - l[order[0]]) / o.temperature));
    s += p.back();
  }
  for (auto& x : p) x /= s;
  long double cum = 0;
  size_t keep = p.size();
  for (size_t i = 0; i < p.size() && o.top_p < 1; ++i) {
    cum += p[i];
    if (cum >= o.top_p) {
      keep = i + 1;
      break;
    }
  }
  std::map<int32_t, double> out;
  long double t = 0;
  for (size_t i = 0; i < keep; ++i)
    if (p[i] >= o.min_p * p[0]) t += p[i];
  for (size_t i = 0; i < keep; ++i)
    if (p[i] >= o.min_p * p[0]) out[order[i]] = static_cast<double>(p[i] / t);
  return out;
}

std::map<int32_t, int> histogram(Sampler& s, const std::vector<float>& l, int draws) {
  std::map<int32_t, int> h;
  for (int i = 0; i < draws; ++i) ++h[s.next(l, {})];
  return h;
}

// log(p) logits: softmax at T = 1 gives back p (up to rounding far below what is tested).
std::vector<float> log_probs(std::initializer_list<double> p) {
  std::vector<float> l;
  for (double x : p) l.push_back(static_cast<float>(std::log(x)));
  return l;
}

}  // namespace

TEST_CASE("splitmix64 and xoshiro256** reproduce the published reference outputs") {
  uint64_t x = 0;
  CHECK(k3::stages::splitmix64(x) == 0xE220A8397B1DCDAFULL);
  CHECK(k3::stages::splitmix64(x) == 0x6E789E6AA1B965F4ULL);
  CHECK(k3::stages::splitmix64(x) == 0x06C45D188009454FULL);

  // State {1, 2, 3, 4}: the vector rand_xoshiro checks against Vigna's reference code.
  auto r = k3::stages::Xoshiro256ss::from_state({1, 2, 3, 4});
  const uint64_t want[] = {11520ULL,
                           0ULL,
                           1509978240ULL,
                           1215971899390074240ULL,
                           1216172134540287360ULL,
                           607988272756665600ULL,
                           16172922978634559625ULL,
                           8476171486693032832ULL,
                           10595114339597558777ULL,
                           2904607092377533576ULL};
  for (uint64_t w : want) CHECK(r.next() == w);

  k3::stages::Xoshiro256ss a(7), b(7);
  for (int i = 0; i < 1000; ++i) {
    const double u = a.uniform();
    CHECK(u >= 0.0);
    CHECK(u < 1.0);
    CHECK(u == static_cast<double>(b.next() >> 11) * 0x1.0p-53);
  }
}

TEST_CASE("exp_nonpositive stays within a few ulp of libm and handles the ends") {
  CHECK(k3::stages::exp_nonpositive(0.0) == 1.0);
  CHECK(k3::stages::exp_nonpositive(-0.0) == 1.0);
  CHECK(k3::stages::exp_nonpositive(-std::numeric_limits<double>::infinity()) == 0.0);
  CHECK(k3::stages::exp_nonpositive(-800.0) == 0.0);
  CHECK(k3::stages::exp_nonpositive(-1e-300) == 1.0);
  std::mt19937_64 g(1);
  double worst = 0;
  for (int i = 0; i < 200000; ++i) {
    const double x = -std::ldexp(static_cast<double>(g() >> 11), -53) * (i % 2 ? 700.0 : 3.0);
    const double got = k3::stages::exp_nonpositive(x), want = std::exp(x);
    CHECK(got <= 1.0);
    worst = std::max(worst, std::abs(got - want) / want);
  }
  CHECK(worst < 4 * std::numeric_limits<double>::epsilon());
  // Subnormal results stay close in absolute terms.
  CHECK(std::abs(k3::stages::exp_nonpositive(-740.0) - std::exp(-740.0)) < 1e-320);
}

TEST_CASE("validate names the flag it refuses") {
  auto with = [](auto set) {
    SamplerOptions o;
    set(o);
    return usage_message(o);
  };
  CHECK(usage_message(SamplerOptions{}).empty());
  CHECK(with([](SamplerOptions& o) { o.temperature = -0.5; }).find("--temperature") == 0);
  CHECK(with([](SamplerOptions& o) { o.temperature = NAN; }).find("--temperature") == 0);
  CHECK(with([](SamplerOptions& o) { o.temperature = INFINITY; }).find("--temperature") == 0);
  CHECK(with([](SamplerOptions& o) { o.top_k = -1; }).find("--top-k") == 0);
  CHECK(with([](SamplerOptions& o) { o.top_p = 0; }).find("--top-p") == 0);
  CHECK(with([](SamplerOptions& o) { o.top_p = 1.5; }).find("--top-p") == 0);
  CHECK(with([](SamplerOptions& o) { o.top_p = NAN; }).find("--top-p") == 0);
  CHECK(with([](SamplerOptions& o) { o.min_p = 1; }).find("--min-p") == 0);
  CHECK(with([](SamplerOptions& o) { o.min_p = -0.1; }).find("--min-p") == 0);
  CHECK(with([](SamplerOptions& o) { o.min_p = NAN; }).find("--min-p") == 0);
  CHECK(with([](SamplerOptions& o) { o.repeat_penalty = 0; }).find("--repeat-penalty") == 0);
  CHECK(with([](SamplerOptions& o) { o.repeat_penalty = INFINITY; }).find("--repeat-penalty") == 0);
  CHECK(with([](SamplerOptions& o) { o.repeat_last_n = -1; }).find("--repeat-last-n") == 0);
  CHECK(with([](SamplerOptions& o) {
          o.top_p = 1;
          o.min_p = 0.99;
          o.top_k = 1;
        }).empty());

  SamplerOptions bad;
  bad.top_k = -3;
  CHECK_THROWS_WITH_AS(Sampler{bad}, "--top-k must be >= 0 (got -3)", k3::io::Error);
}

TEST_CASE("greedy is stages::greedy bit for bit, ties included, whatever the seed") {
  std::mt19937 g(11);
  for (int trial = 0; trial < 50; ++trial) {
    const std::vector<float> l = trial % 2 ? random_logits(g, 5000) : tied_logits(g, 5000);
    SamplerOptions o;
    o.seed = static_cast<uint64_t>(trial);
    o.top_k = 3;  // ignored when greedy
    Sampler s(o);
    CHECK(s.next(l, std::vector<int32_t>{1, 2, 3}) == k3::stages::greedy(l));
  }
  const std::vector<float> ties{1.0f, 3.0f, 3.0f, -2.0f, 3.0f};
  Sampler s(SamplerOptions{});
  CHECK(s.next(ties, {}) == 1);
  CHECK(k3::stages::greedy(ties) == 1);
}

TEST_CASE("the same seed gives the same sequence, another seed a different one") {
  std::mt19937 g(5);
  const std::vector<float> l = random_logits(g, 2000, 1.0f);
  SamplerOptions o;
  o.temperature = 1.0;
  o.seed = 1234;
  Sampler a(o), b(o);
  o.seed = 1235;
  Sampler c(o);
  std::vector<int32_t> sa, sb, sc;
  for (int i = 0; i < 300; ++i) {
    sa.push_back(a.next(l, sa));
    sb.push_back(b.next(l, sb));
    sc.push_back(c.next(l, sc));
  }
  CHECK(sa == sb);
  CHECK(sa != sc);
}

TEST_CASE("top-k never leaves the k best, and each of them is drawn") {
  std::mt19937 g(8);
  std::vector<float> l = random_logits(g, 4000, 0.5f);
  // Make the 6th and 7th best tie so the id rule decides who is in.
  std::vector<int32_t> order(l.size());
  for (size_t i = 0; i < l.size(); ++i) order[i] = static_cast<int32_t>(i);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return l[a] > l[b]; });
  l[order[6]] = l[order[5]];
  const int32_t lo = std::min(order[5], order[6]), hi = std::max(order[5], order[6]);
  const std::set<int32_t> best{order[0], order[1], order[2], order[3], order[4], lo};

  SamplerOptions o;
  o.temperature = 1.5;
  o.top_k = 6;
  o.seed = 3;
  Sampler s(o);
  const auto h = histogram(s, l, 30000);
  std::set<int32_t> seen;
  for (const auto& [id, n] : h) seen.insert(id);
  CHECK(seen == best);
  CHECK(h.count(hi) == 0);
}

TEST_CASE("top-p draws exactly the nucleus, every member of it") {
  // Cumulative 0.4, 0.7, 0.9: the shortest prefix reaching 0.85 is the first three.
  const std::vector<float> l = log_probs({0.06, 0.4, 0.04, 0.3, 0.2});
  SamplerOptions o;
  o.temperature = 1;
  o.top_p = 0.85;
  o.seed = 99;
  Sampler s(o);
  std::set<int32_t> seen;
  for (const auto& [id, n] : histogram(s, l, 20000)) seen.insert(id);
  CHECK(seen == std::set<int32_t>{1, 3, 4});

  // A tiny top-p keeps just the best candidate.
  o.top_p = 1e-9;
  Sampler one(o);
  for (int i = 0; i < 100; ++i) CHECK(one.next(l, {}) == 1);
}

TEST_CASE("min-p keeps exactly the candidates within the ratio of the best") {
  // p_max = 0.4; min_p 0.2 keeps p >= 0.08: ids 1, 3, 4 (0.06 and 0.04 fall out).
  const std::vector<float> l = log_probs({0.06, 0.4, 0.04, 0.3, 0.2});
  SamplerOptions o;
  o.temperature = 1;
  o.min_p = 0.2;
  o.seed = 17;
  Sampler s(o);
  std::set<int32_t> seen;
  for (const auto& [id, n] : histogram(s, l, 20000)) seen.insert(id);
  CHECK(seen == std::set<int32_t>{1, 3, 4});
  // min_p 0.12: threshold 0.048 keeps 0.06 and drops 0.04.
  o.min_p = 0.12;
  Sampler s2(o);
  seen.clear();
  for (const auto& [id, n] : histogram(s2, l, 20000)) seen.insert(id);
  CHECK(seen == std::set<int32_t>{0, 1, 3, 4});
}

TEST_CASE("the repeat penalty changes exactly the distinct ids of the last n, once each") {
  const std::vector<float> base{2.0f, -1.0f, 0.0f, 3.0f, 1.5f, -4.0f, 0.5f};
  std::vector<float> l = base;
  // Window of 4: {5, 0, 0, 1}; ids 3 and 6 sit before it.
  const std::vector<int32_t> ctx{3, 6, 5, 0, 0, 1};
  k3::stages::apply_repeat_penalty(l, ctx, 2.0, 4);
  CHECK(l[0] == 1.0f);   // positive: divided, once despite appearing twice
  CHECK(l[1] == -2.0f);  // negative: multiplied
  CHECK(l[5] == -8.0f);
  CHECK(l[2] == 0.0f);  // outside the window
  CHECK(l[3] == 3.0f);
  CHECK(l[4] == 1.5f);
  CHECK(l[6] == 0.5f);
  const std::vector<int32_t> zero_ctx{2};
  std::vector<float> z = base;
  k3::stages::apply_repeat_penalty(z, zero_ctx, 2.0, 4);
  CHECK(z == base);  // 0 * r = 0

  // Through the sampler: id 3 is best; penalising it hands greedy to id 0.
  SamplerOptions o;
  o.repeat_penalty = 2.0;
  o.repeat_last_n = 2;
  Sampler s(o);
  CHECK(s.next(base, std::vector<int32_t>{4, 3}) == 0);
  CHECK(s.next(base, std::vector<int32_t>{3, 4, 6}) == 3);  // 3 fell out of the last 2
  o.repeat_last_n = 0;
  Sampler off(o);
  CHECK(off.next(base, std::vector<int32_t>{3}) == 3);
  o.repeat_last_n = 64;
  o.repeat_penalty = 1.0;
  Sampler neutral(o);
  CHECK(neutral.next(base, std::vector<int32_t>{3}) == 3);

  std::vector<float> bad = base;
  CHECK_THROWS_AS(k3::stages::apply_repeat_penalty(bad, std::vector<int32_t>{7}, 1.5, 4), k3::io::Error);
  CHECK_THROWS_AS(k3::stages::apply_repeat_penalty(bad, std::vector<int32_t>{-1}, 1.5, 4), k3::io::Error);
}

TEST_CASE("200k draws match the exact probabilities of the definition") {
  const std::vector<float> l{1.0f, 2.5f, 0.25f, 2.5f, -1.0f, 1.75f, 0.0f, -3.0f};
  struct Case {
    double temperature;
    int top_k;
    double top_p, min_p;
  };
  for (const Case c : {Case{0.8, 0, 1, 0}, Case{1.3, 5, 0.9, 0}, Case{1.0, 0, 1, 0.15}}) {
    SamplerOptions o;
    o.temperature = c.temperature;
    o.top_k = c.top_k;
    o.top_p = c.top_p;
    o.min_p = c.min_p;
    o.seed = 2024;
    Sampler s(o);
    const int N = 200000;
    const auto h = histogram(s, l, N);
    const auto exact = exact_distribution(l, o);
    double chi2 = 0, worst = 0;
    for (const auto& kv : h)  // not a binding: CHECK_MESSAGE's lambda cannot capture one under clang 14
      CHECK_MESSAGE(exact.count(kv.first) == 1, "drew id ", kv.first, " outside the kept set");
    for (const auto& [id, p] : exact) {
      const double got = h.count(id) ? h.at(id) : 0;
      chi2 += (got - N * p) * (got - N * p) / (N * p);
      worst = std::max(worst, std::abs(got / N - p));
    }
    // <= 7 degrees of freedom: chi2 > 35 has probability below 1e-5; 5 sigma of a proportion is
    // under 0.0056.
    CHECK(chi2 < 35.0);
    CHECK(worst < 0.0056);
  }
}

TEST_CASE("golden sequences equal a straightforward full-sort implementation of the definition") {
  struct Case {
    SamplerOptions o;
    bool ties;
  };
  std::vector<Case> cases;
  auto add = [&](double t, int k, double p, double m, double r, int n, uint64_t seed, bool ties) {
    SamplerOptions o;
    o.temperature = t;
    o.top_k = k;
    o.top_p = p;
    o.min_p = m;
    o.repeat_penalty = r;
    o.repeat_last_n = n;
    o.seed = seed;
    cases.push_back({o, ties});
  };
  add(0.9, 50, 0.9, 0.05, 1.3, 16, 42, false);
  add(0.9, 50, 0.9, 0.05, 1.3, 16, 42, true);
  add(1.0, 0, 1.0, 0.0, 1.0, 64, 7, true);
  add(0.7, 0, 0.95, 0.0, 1.1, 64, 8, false);
  add(1.2, 3000, 1.0, 0.02, 0.8, 5, 9, true);
  add(2.0, 1, 1.0, 0.0, 1.0, 64, 10, false);
  add(1e-30, 0, 1.0, 0.0, 1.0, 64, 11, true);
  add(0.0, 10, 0.5, 0.1, 1.5, 32, 12, true);

  for (const Case& c : cases) {
    std::mt19937 g(static_cast<uint32_t>(c.o.seed));
    Sampler fast(c.o);
    ReferenceSampler slow(c.o);
    std::vector<int32_t> ctx{1, 2, 3};
    int distinct_draws = 0;
    for (int step = 0; step < 60; ++step) {
      std::vector<float> l = c.ties ? tied_logits(g, 3000) : random_logits(g, 3000);
      const int32_t a = fast.next(l, ctx), b = slow.next(l, ctx);
      REQUIRE(a == b);
      distinct_draws += a != k3::stages::greedy(l);
      ctx.push_back(a);
    }
    if (c.o.top_k == 1 && c.o.repeat_penalty == 1)
      CHECK(distinct_draws == 0);  // top-1 is greedy whatever the temperature
    else if (c.o.temperature >= 0.7)
      CHECK(distinct_draws > 0);  // these really sampled
  }
}

TEST_CASE("bad logits are refused when drawing") {
  SamplerOptions o;
  o.temperature = 1;
  Sampler s(o);
  CHECK_THROWS_WITH_AS(s.next(std::vector<float>{}, {}), "sampler: empty logits row", k3::io::Error);
  CHECK_THROWS_WITH_AS(s.next(std::vector<float>{1.0f, NAN}, {}), "sampler: logit 1 is nan", k3::io::Error);
  CHECK_THROWS_AS(s.next(std::vector<float>{1.0f, INFINITY}, {}), k3::io::Error);
  const float ninf = -std::numeric_limits<float>::infinity();
  CHECK_THROWS_WITH_AS(s.next(std::vector<float>{ninf, ninf}, {}), "sampler: every logit is -inf",
                       k3::io::Error);
  // -inf logits are simply never drawn.
  for (int i = 0; i < 200; ++i) CHECK(s.next(std::vector<float>{ninf, 0.0f, ninf, 0.0f}, {}) % 2 == 1);
}

TEST_CASE("presence and frequency penalties: OpenAI's definition on hand-computed logits") {
  std::vector<float> l = {1.0f, 2.0f, -1.0f, 0.5f, 3.0f};
  const std::vector<int32_t> generated = {1, 3, 1};
  k3::stages::apply_presence_frequency(l, generated, 0.5, 0.25);
  // id 1: twice -> 2 - (0.5 + 2 * 0.25); id 3: once -> 0.5 - (0.5 + 0.25); the rest unchanged.
  CHECK(l == std::vector<float>{1.0f, 1.0f, -1.0f, -0.25f, 3.0f});
  std::vector<float> neg = {0.0f, 1.0f};
  k3::stages::apply_presence_frequency(neg, std::vector<int32_t>{0, 0, 0}, -1.0, -0.5);
  CHECK(neg == std::vector<float>{2.5f, 1.0f});  // negative values favour repeats
  std::vector<float> small = {0.0f};
  CHECK_THROWS_AS(k3::stages::apply_presence_frequency(small, std::vector<int32_t>{1}, 1, 0), k3::io::Error);

  // Through the sampler (greedy): only the ids after the reply start count.
  SamplerOptions o;
  o.presence_penalty = 0.2;
  Sampler s(o);
  const std::vector<float> row = {0.0f, 2.0f, 1.9f};
  std::vector<int32_t> ctx = {1};  // the prompt: its id 1 is not penalised
  CHECK(s.next(row, ctx) == 1);    // reply starts at 1
  ctx.push_back(1);
  CHECK(s.next(row, ctx) == 2);  // 2.0 - 0.2 < 1.9
  Sampler marked(o);
  marked.start_reply(0);  // everything counts, the prompt's id 1 too
  CHECK(marked.next(row, std::vector<int32_t>{1}) == 2);

  SamplerOptions bad;
  bad.presence_penalty = 2.5;
  CHECK_THROWS_WITH_AS(k3::stages::validate(bad), doctest::Contains("--presence-penalty"), k3::io::Error);
  bad.presence_penalty = 0;
  bad.frequency_penalty = std::nan("");
  CHECK_THROWS_WITH_AS(k3::stages::validate(bad), doctest::Contains("--frequency-penalty"), k3::io::Error);
}

TEST_CASE("token_logprob is the log-softmax of the row, and the top ids are its largest logits") {
  std::mt19937 g(21);
  std::vector<float> l = tied_logits(g, 3000);
  l[17] = -std::numeric_limits<float>::infinity();
  // Independent: long double, libm's expl / logl, no max subtraction shortcut shared with the code.
  long double sum = 0;
  for (float x : l) sum += std::exp(static_cast<long double>(x));
  const auto expect = [&](int32_t id) {
    return double(static_cast<long double>(l[size_t(id)]) - std::log(sum));
  };
  for (int32_t id : {0, 5, 1234, 2999}) {
    const k3::stages::TokenLogprob r = k3::stages::token_logprob(l, id, 5);
    CHECK(r.id == id);
    CHECK(r.logprob == doctest::Approx(expect(id)).epsilon(1e-12));
    REQUIRE(r.top.size() == 5);
    std::vector<int32_t> order(l.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = int32_t(i);
    std::stable_sort(order.begin(), order.end(),
                     [&](int32_t a, int32_t b) { return l[size_t(a)] > l[size_t(b)]; });
    for (size_t i = 0; i < 5; ++i) {
      CHECK(r.top[i].id == order[i]);  // stable: equal logits keep the lower id first
      CHECK(r.top[i].logprob == doctest::Approx(expect(order[i])).epsilon(1e-12));
    }
  }
  CHECK(k3::stages::token_logprob(l, 17, 0).logprob == -std::numeric_limits<double>::infinity());
  CHECK(k3::stages::token_logprob(l, 17, 0).top.empty());
}

TEST_CASE("a constraint masks before the repeat penalty and draws never pick a masked id") {
  // Allows only even ids; records what it was told.
  struct Evens final : k3::stages::TokenConstraint {
    std::vector<uint64_t> bits;
    std::vector<int32_t> accepted;
    std::span<const uint64_t> allowed(size_t vocab) override {
      bits.assign((vocab + 63) / 64, 0);
      for (size_t i = 0; i < vocab; i += 2) bits[i / 64] |= uint64_t(1) << (i % 64);
      return bits;
    }
    void accept(int32_t id) override { accepted.push_back(id); }
    bool done() const override { return false; }
  };
  std::mt19937 g(5);
  for (double t : {0.0, 0.8, 1e-6}) {
    SamplerOptions o;
    o.temperature = t;
    o.top_k = t > 0.5 ? 0 : 3;
    o.seed = 9;
    Sampler s(o);
    auto c = std::make_unique<Evens>();
    Evens* evens = c.get();
    s.set_constraint(std::move(c));
    std::vector<int32_t> ids;
    for (int i = 0; i < 200; ++i) {
      const std::vector<float> l = random_logits(g, 101);
      const int32_t id = s.next(l, ids);
      CHECK(id % 2 == 0);
      if (t == 0) {
        std::vector<float> masked = l;
        for (size_t j = 1; j < masked.size(); j += 2) masked[j] = -std::numeric_limits<float>::infinity();
        CHECK(id == k3::stages::greedy(masked));
      }
      ids.push_back(id);
    }
    CHECK(evens->accepted == ids);
  }
}
