// stages::forward_batch: several sequences in one pass over fixtures/tiny-k3 (resident). Each
// segment's logits and carried state (KDA + conv state, MLA KV rows) must be the bytes of
// stages::forward on that sequence alone, whatever the other segments are (prompts and single ids
// mixed, different positions, one segment alone); a prompt fed in pieces must equal it fed whole
// (what BatchEngine's chunked prefill relies on); batched decode steps of sequences at different
// lengths are their solo greedy runs; bad segments are refused before anything runs.
#include <doctest/doctest.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "io/error.hpp"
#include "kernels/argmax.hpp"
#include "pipeline/run/decoder.hpp"
#include "stages/forward.hpp"

using namespace k3;

namespace {

const std::string kTiny = std::string(K3_FIXTURES) + "/tiny-k3";
constexpr size_t kCap = 48;

struct Model {
  io::ModelConfig cfg = pipeline::load_model_config(kTiny, std::nullopt);
  io::ShardSet shards = pipeline::open_model_shards(kTiny);
  int n = pipeline::bound_layers(cfg, 0);
  std::unique_ptr<stages::ResidentModel> w =
      pipeline::load_resident(shards, cfg, n, pipeline::Progress::Mode::never);
  size_t V() const { return size_t(cfg.vocab); }
};

Model& model() {
  static Model m;
  return m;
}

std::string bytes(std::span<const float> v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size_bytes());
}

// Every byte a state carries (positions fed, KDA + conv, the cached KV and rope rows).
std::string state_bytes(stages::DecodeState& s) {
  std::string out = std::to_string(s.cached) + ":";
  for (int l = 0; l < s.n_bound(); ++l) out += bytes(s.kda_layer(l));
  for (int m = 0; m < s.n_mla(); ++m) out += bytes(s.kv_rows(m, s.cached)) + bytes(s.rope_rows(m, s.cached));
  return out;
}

// A sequence fed alone, one forward() per chunk: the logits after each chunk.
std::vector<std::string> solo(stages::DecodeState& st, const std::vector<std::vector<int32_t>>& chunks) {
  Model& m = model();
  stages::Scratch sc;
  std::vector<float> logits(m.V());
  std::vector<std::string> out;
  for (const auto& ids : chunks) {
    stages::forward(*m.w, st, ids, stages::HeadAt::last, logits, sc);
    out.push_back(bytes(logits));
  }
  return out;
}

}  // namespace

TEST_CASE("forward_batch: every segment's logits and state are its solo bytes") {
  Model& m = model();
  // Three sequences, fed over three passes: prompts of different lengths, then single ids, a new
  // prompt joining while the others decode, and a pass where one sequence sits out.
  const std::vector<std::vector<std::vector<int32_t>>> feeds = {
      {{203, 34, 2, 239, 195}, {17}, {88}},
      {{71, 163}, {}, {9}},
      {{}, {54, 121, 104, 16, 16, 219, 63}, {200}},
  };
  std::vector<std::unique_ptr<stages::DecodeState>> batched, alone;
  for (size_t i = 0; i < feeds.size(); ++i) {
    batched.push_back(std::make_unique<stages::DecodeState>(m.cfg, m.n, kCap));
    alone.push_back(std::make_unique<stages::DecodeState>(m.cfg, m.n, kCap));
  }
  std::vector<std::vector<std::string>> want(feeds.size()), got(feeds.size());
  for (size_t i = 0; i < feeds.size(); ++i) {
    std::vector<std::vector<int32_t>> chunks;
    for (const auto& c : feeds[i])
      if (!c.empty()) chunks.push_back(c);
    want[i] = solo(*alone[i], chunks);
  }
  stages::Scratch sc;
  for (size_t pass = 0; pass < 3; ++pass) {
    std::vector<int32_t> ids;
    std::vector<stages::Segment> segs;
    std::vector<size_t> who;
    for (size_t i = 0; i < feeds.size(); ++i) {
      const auto& c = feeds[i][pass];
      if (c.empty()) continue;
      segs.push_back({.state = batched[i].get(), .first_row = ids.size(), .rows = c.size()});
      ids.insert(ids.end(), c.begin(), c.end());
      who.push_back(i);
    }
    std::vector<float> logits(segs.size() * m.V());
    stages::forward_batch(*m.w, segs, ids, logits, sc);
    for (size_t s = 0; s < segs.size(); ++s)
      got[who[s]].push_back(bytes(std::span<const float>(logits).subspan(s * m.V(), m.V())));
  }
  for (size_t i = 0; i < feeds.size(); ++i) {
    CAPTURE(i);
    REQUIRE(got[i].size() == want[i].size());
    for (size_t k = 0; k < want[i].size(); ++k) CHECK(got[i][k] == want[i][k]);
    CHECK(batched[i]->cached == alone[i]->cached);
    CHECK(state_bytes(*batched[i]) == state_bytes(*alone[i]));
  }
}

TEST_CASE("forward_batch: decode steps of four sequences at different lengths are each its solo greedy run") {
  // The serving shape: every segment is one row, each at its own cached length (so each MLA
  // segment attends over a different number of positions and each KDA state differs), and the
  // projections run once over the four rows.
  Model& m = model();
  const std::vector<std::vector<int32_t>> prompts = {
      {5}, {203, 34, 2, 239, 195, 17, 88}, {71, 163, 9}, {54, 121, 104, 16, 16, 219, 63, 4, 31, 7, 7, 90}};
  constexpr size_t kSteps = 4;
  const size_t n = prompts.size();
  auto argmax = [&](const std::string& b) {
    std::vector<float> v(m.V());
    std::memcpy(v.data(), b.data(), b.size());
    return int32_t(kernels::argmax(v));
  };
  std::vector<std::unique_ptr<stages::DecodeState>> batched, alone;
  std::vector<std::vector<std::string>> want(n), got(n);
  std::vector<int32_t> next(n);
  for (size_t i = 0; i < n; ++i) {
    alone.push_back(std::make_unique<stages::DecodeState>(m.cfg, m.n, kCap));
    batched.push_back(std::make_unique<stages::DecodeState>(m.cfg, m.n, kCap));
    int32_t id = argmax(solo(*alone[i], {prompts[i]}).back());
    for (size_t k = 0; k < kSteps; ++k) {
      want[i].push_back(solo(*alone[i], {{id}}).back());
      id = argmax(want[i].back());
    }
    next[i] = argmax(solo(*batched[i], {prompts[i]}).back());
  }
  stages::Scratch sc;
  for (size_t k = 0; k < kSteps; ++k) {
    std::vector<stages::Segment> segs;
    for (size_t i = 0; i < n; ++i) segs.push_back({.state = batched[i].get(), .first_row = i, .rows = 1});
    std::vector<float> logits(n * m.V());
    stages::forward_batch(*m.w, segs, next, logits, sc);
    for (size_t i = 0; i < n; ++i) {
      got[i].push_back(bytes(std::span<const float>(logits).subspan(i * m.V(), m.V())));
      next[i] = argmax(got[i].back());
    }
  }
  for (size_t i = 0; i < n; ++i) {
    CAPTURE(i);
    CHECK(got[i] == want[i]);
    CHECK(state_bytes(*batched[i]) == state_bytes(*alone[i]));
  }
}

TEST_CASE("forward_batch: one segment is forward(); a prompt in pieces is the prompt whole") {
  Model& m = model();
  const std::vector<int32_t> prompt = {54, 121, 104, 16, 16, 219, 63, 4, 31};
  stages::DecodeState whole(m.cfg, m.n, kCap), one(m.cfg, m.n, kCap), pieces(m.cfg, m.n, kCap);
  const std::string w = solo(whole, {prompt}).back();
  stages::Scratch sc;
  std::vector<float> logits(m.V());
  const stages::Segment seg{.state = &one, .first_row = 0, .rows = prompt.size()};
  stages::forward_batch(*m.w, std::span(&seg, 1), prompt, logits, sc);
  CHECK(bytes(logits) == w);
  CHECK(state_bytes(one) == state_bytes(whole));
  // Chunked prefill: 4 + 4 + 1 ids, each chunk in its own pass beside another sequence's token.
  stages::DecodeState other(m.cfg, m.n, kCap);
  solo(other, {{1, 2, 3}});
  int32_t next = 7;
  for (size_t at = 0; at < prompt.size(); at += 4) {
    const size_t n = std::min<size_t>(4, prompt.size() - at);
    std::vector<int32_t> ids = {next};
    ids.insert(ids.end(), prompt.begin() + long(at), prompt.begin() + long(at + n));
    const std::vector<stages::Segment> segs = {{.state = &other, .first_row = 0, .rows = 1},
                                               {.state = &pieces, .first_row = 1, .rows = n}};
    std::vector<float> two(2 * m.V());
    stages::forward_batch(*m.w, segs, ids, two, sc);
    next = int32_t(kernels::argmax(std::span<const float>(two).first(m.V())));
    std::copy(two.begin() + long(m.V()), two.end(), logits.begin());
  }
  CHECK(bytes(logits) == w);
  CHECK(state_bytes(pieces) == state_bytes(whole));
}

TEST_CASE("forward_batch: bad segments are refused before any state changes") {
  Model& m = model();
  stages::DecodeState a(m.cfg, m.n, kCap), b(m.cfg, m.n, 4);
  stages::Scratch sc;
  std::vector<float> logits(2 * m.V());
  const std::vector<int32_t> ids = {1, 2, 3, 4, 5, 6};
  const std::vector<stages::Segment> same = {{.state = &a, .first_row = 0, .rows = 3},
                                             {.state = &a, .first_row = 3, .rows = 3}};
  CHECK_THROWS_WITH_AS(stages::forward_batch(*m.w, same, ids, logits, sc), doctest::Contains("same state"),
                       io::Error);
  const std::vector<stages::Segment> full = {{.state = &a, .first_row = 0, .rows = 1},
                                             {.state = &b, .first_row = 1, .rows = 5}};
  CHECK_THROWS_WITH_AS(stages::forward_batch(*m.w, full, ids, logits, sc),
                       doctest::Contains("segment 1: MLA KV cache overflow"), io::Error);
  const std::vector<stages::Segment> gap = {{.state = &a, .first_row = 0, .rows = 2},
                                            {.state = &b, .first_row = 3, .rows = 3}};
  CHECK_THROWS_AS(stages::forward_batch(*m.w, gap, ids, logits, sc), io::Error);
  const std::vector<stages::Segment> short_ = {{.state = &a, .first_row = 0, .rows = 2}};
  CHECK_THROWS_AS(stages::forward_batch(*m.w, short_, ids, logits, sc), io::Error);
  CHECK(a.cached == 0);
  CHECK(b.cached == 0);
}
