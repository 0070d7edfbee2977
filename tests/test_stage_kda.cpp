// stages/kda.*: a whole KDA attention block against fixtures/ops/kda_layer{1,8}.json, and several
// sequences in one multi-segment pass against each alone.
#include <doctest/doctest.h>

#include <vector>

#include "stages/kda.hpp"
#include "tests/stage_helpers.hpp"

using namespace k3;
using test::Fixture;

namespace {

// Four sequences (warmed by different solo prefixes, one fresh) fed in ONE multi-segment pass:
// each segment's output rows and state are the bytes of feeding it alone. Inputs are fixture rows.
void check_segments(const stages::KdaWeights& w, const io::ModelConfig& c, std::span<const float> in,
                    size_t T) {
  const size_t E = static_cast<size_t>(c.hidden);
  struct Seq {
    size_t warm_from, warm, from, rows;
  };
  const Seq seqs[] = {{0, 3, 3, 1}, {0, 0, 4, 2}, {6, 1, 7, 1}, {1, 5, 0, 3}};
  auto rows_of = [&](size_t from, size_t n) {
    std::vector<float> x;
    for (size_t i = 0; i < n; ++i) {
      const auto r = in.subspan(((from + i) % T) * E, E);
      x.insert(x.end(), r.begin(), r.end());
    }
    return x;
  };
  const size_t n = std::size(seqs);
  std::vector<std::vector<float>> solo(n), batched(n), want_out(n);
  std::vector<float> x, out;
  std::vector<stages::KdaSegment> segs;
  for (size_t i = 0; i < n; ++i) {
    const Seq& q = seqs[i];
    solo[i].assign(stages::kda_state_floats(c), 0.0f);
    batched[i].assign(stages::kda_state_floats(c), 0.0f);
    for (std::vector<float>* st : {&solo[i], &batched[i]}) {
      if (q.warm == 0) continue;
      const auto wx = rows_of(q.warm_from, q.warm);
      std::vector<float> wo(q.warm * E), sc(stages::attention_kda_scratch(c, q.warm));
      stages::attention_kda(w, c, wx, q.warm, stages::kda_state_view(c, *st), wo, sc);
    }
    const auto bx = rows_of(q.from, q.rows);
    want_out[i].resize(q.rows * E);
    std::vector<float> sc(stages::attention_kda_scratch(c, q.rows));
    stages::attention_kda(w, c, bx, q.rows, stages::kda_state_view(c, solo[i]), want_out[i], sc);
    segs.push_back(
        {.state = stages::kda_state_view(c, batched[i]), .first_row = x.size() / E, .rows = q.rows});
    x.insert(x.end(), bx.begin(), bx.end());
  }
  const size_t rows = x.size() / E;
  out.resize(rows * E);
  std::vector<float> sc(stages::attention_kda_scratch(c, rows));
  stages::attention_kda(w, c, x, rows, segs, out, sc);
  for (size_t i = 0; i < n; ++i) {
    CAPTURE(i);
    const auto got = std::span<const float>(out).subspan(segs[i].first_row * E, segs[i].rows * E);
    CHECK(std::vector<float>(got.begin(), got.end()) == want_out[i]);
    CHECK(batched[i] == solo[i]);
  }
}

void check_kda_layer(const char* file) {
  const Fixture f(file);
  const auto tol = test::manifest_tolerance();
  io::ModelConfig c = test::tiny_config();
  const size_t T = f.count("T"), H = f.count("H"), D = f.count("d_k"), E = static_cast<size_t>(c.hidden);
  REQUIRE(H == static_cast<size_t>(c.kda_heads));
  REQUIRE(D == static_cast<size_t>(c.kda_head_dim));
  REQUIRE(f.count("conv_k") == static_cast<size_t>(c.conv_kernel));
  c.gate_lower_bound = static_cast<float>(f.number("lower_bound"));
  c.rms_eps = static_cast<float>(f.number("rms_eps"));

  const auto q = f.tensor("q_proj"), k = f.tensor("k_proj"), v = f.tensor("v_proj"), g = f.tensor("g_proj");
  const auto o = f.tensor("o_proj"), fa = f.tensor("f_a"), fb = f.tensor("f_b"), b = f.tensor("b_proj");
  const auto qc = f.tensor("q_conv"), kc = f.tensor("k_conv"), vc = f.tensor("v_conv");
  const auto a_log = f.tensor("A_log"), dt = f.tensor("dt_bias"), on = f.tensor("o_norm");
  stages::KdaWeights w{test::f32(q),  test::f32(k),  test::f32(v), test::f32(g), test::f32(o),
                       test::f32(fa), test::f32(fb), test::f32(b), qc.data,      kc.data,
                       vc.data,       a_log.data,    dt.data,      on.data};

  const auto in = f.tensor("in"), want = f.tensor("out"), want_state = f.tensor("state_out");
  REQUIRE(in.numel() == T * E);
  std::vector<float> state(stages::kda_state_floats(c), 0.0f), out(T * E);
  std::vector<float> scratch(stages::attention_kda_scratch(c, T));
  stages::attention_kda(w, c, in.data, T, stages::kda_state_view(c, state), out, scratch);

  auto cmp = test::compare(out, want.data, tol);
  INFO(file << " out: " << cmp.str());
  CHECK(cmp.ok());
  cmp = test::compare(std::span<const float>(state).first(H * D * D), want_state.data, tol);
  INFO(file << " state: " << cmp.str());
  CHECK(cmp.ok());

  // Feeding the same tokens one call at a time (carried state) gives the same bits.
  std::vector<float> state2(state.size(), 0.0f), out2(T * E);
  for (size_t t = 0; t < T; ++t)
    stages::attention_kda(w, c, std::span<const float>(in.data).subspan(t * E, E), 1,
                          stages::kda_state_view(c, state2), std::span<float>(out2).subspan(t * E, E),
                          scratch);
  CHECK(out2 == out);
  CHECK(state2 == state);

  check_segments(w, c, in.data, T);
}

}  // namespace

TEST_CASE("attention_kda matches kda_layer1.json") {
  check_kda_layer("ops/kda_layer1.json");
}
TEST_CASE(
    "attention_kda matches kda_layer8.json, token-by-token equals one call, segments of one pass equal each "
    "alone") {
  check_kda_layer("ops/kda_layer8.json");
}
