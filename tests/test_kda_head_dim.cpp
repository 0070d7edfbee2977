// KDA past head_dim 256, where the step bodies once wrote past a 256-float stack array: the whole
// KDA attention stage gives the same bits under every body and thread count, and `k3flow generate`
// on a synthetic --head-dim 512 model runs and gives the same ids and logits under
// K3FLOW_ISA=scalar as under the default body.
#include <doctest/doctest.h>
#include <fmt/format.h>
#include <tbb/global_control.h>
#include <tbb/task_arena.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/dispatch.hpp"
#include "stages/kda.hpp"
#include "tests/isa_bodies.hpp"
#include "tests/run_helpers.hpp"
#include "tests/stage_helpers.hpp"

using namespace k3;
using test::Run;
using test::slurp;
using test::TempDir;

namespace {

struct Rng {
  uint32_t s;
  float unit() {  // uniform in [-1, 1)
    s ^= s << 13;
    s ^= s >> 17;
    s ^= s << 5;
    return static_cast<float>(s >> 8) / 8388608.0f - 1.0f;
  }
  std::vector<float> fill(size_t n, float scale, float offset = 0.0f) {
    std::vector<float> v(n);
    for (float& x : v) x = offset + scale * unit();
    return v;
  }
};

// Random KDA weights in the shapes of docs/model.md §2.2 for config `c` (all f32).
struct KdaTensors {
  std::vector<float> q, k, v, g, o, f_a, f_b, b, q_conv, k_conv, v_conv, a_log, dt_bias, o_norm;
  size_t E, H, D, P, K;

  KdaTensors(const io::ModelConfig& c, Rng& rng)
      : E(size_t(c.hidden)),
        H(size_t(c.kda_heads)),
        D(size_t(c.kda_head_dim)),
        P(H * D),
        K(size_t(c.conv_kernel)) {
    q = rng.fill(P * E, 0.1f);
    k = rng.fill(P * E, 0.1f);
    v = rng.fill(P * E, 0.1f);
    g = rng.fill(P * E, 0.1f);
    o = rng.fill(E * P, 0.05f);
    f_a = rng.fill(D * E, 0.1f);
    f_b = rng.fill(P * D, 0.1f);
    b = rng.fill(H * E, 0.1f);
    q_conv = rng.fill(P * K, 0.4f);
    k_conv = rng.fill(P * K, 0.4f);
    v_conv = rng.fill(P * K, 0.4f);
    a_log = rng.fill(H, 0.8f, 0.4f);
    dt_bias = rng.fill(P, 0.5f);
    o_norm = rng.fill(D, 0.1f, 1.0f);
  }
  stages::KdaWeights view() const {
    auto m = [](const std::vector<float>& w, size_t rows, size_t cols) {
      return kernels::F32Matrix{w, rows, cols};
    };
    return {m(q, P, E), m(k, P, E), m(v, P, E), m(g, P, E), m(o, E, P), m(f_a, D, E), m(f_b, P, D),
            m(b, H, E), q_conv,     k_conv,     v_conv,     a_log,      dt_bias,      o_norm};
  }
};

// The "generated_ids":[...] array of a run report, as text.
std::string generated_ids(const std::string& json) {
  const size_t at = json.find("\"generated_ids\":[");
  if (at == std::string::npos) return "<missing generated_ids>";
  const size_t open = json.find('[', at), close = json.find(']', open);
  return json.substr(open + 1, close - open - 1);
}

}  // namespace

TEST_CASE("attention_kda at head_dim 72, 320, 512: every body and thread count gives the same bits") {
  const k3::test::BodyCheck bodies{kernels::Kernel::kda_step};
  static tbb::global_control allow(tbb::global_control::max_allowed_parallelism, 8);
  const kernels::Isa saved = kernels::active_isa();
  for (int D : {72, 320, 512}) {
    CAPTURE(D);
    io::ModelConfig c = test::tiny_config();
    c.kda_head_dim = D;
    Rng rng{0xC0FFEEu + uint32_t(D)};
    const KdaTensors t(c, rng);
    const stages::KdaWeights w = t.view();
    constexpr size_t T = 3;
    const std::vector<float> x = rng.fill(T * t.E, 1.0f);

    // Two calls, so the second starts from a carried non-zero state; the scratch is exactly what
    // the stage publishes (its carver refuses less).
    auto run = [&](std::vector<float>& state, std::vector<float>& out) {
      state.assign(stages::kda_state_floats(c), 0.0f);
      out.assign(2 * T * t.E, NAN);
      std::vector<float> scratch(stages::attention_kda_scratch(c, T), NAN);
      for (size_t call = 0; call < 2; ++call)
        stages::attention_kda(w, c, x, T, stages::kda_state_view(c, state),
                              std::span<float>(out).subspan(call * T * t.E, T * t.E), scratch);
    };

    std::vector<float> want_state, want_out;
    kernels::set_active_isa(kernels::Isa::scalar);
    {
      tbb::task_arena one(1);
      one.execute([&] { run(want_state, want_out); });
    }
    REQUIRE(std::all_of(want_out.begin(), want_out.end(), [](float v) { return std::isfinite(v); }));
    REQUIRE(std::any_of(want_out.begin(), want_out.end(), [](float v) { return v != 0.0f; }));

    for (kernels::Isa isa : kernels::supported_isas()) {
      kernels::set_active_isa(isa);
      for (int threads : {1, 2}) {
        const std::string isa_s = kernels::isa_name(isa);
        CAPTURE(isa_s);
        CAPTURE(threads);
        std::vector<float> state, out;
        tbb::task_arena arena(threads);
        arena.execute([&] { run(state, out); });
        CHECK(std::memcmp(out.data(), want_out.data(), out.size() * sizeof(float)) == 0);
        CHECK(std::memcmp(state.data(), want_state.data(), state.size() * sizeof(float)) == 0);
      }
    }
  }
  kernels::set_active_isa(saved);
  bodies.check();
}

TEST_CASE("k3flow generate on a synthetic --head-dim 512 model: exit 0, same ids and logits on every body") {
  TempDir dir;
  const std::string model = dir / "kda512";
  const Run s = test::k3flow(fmt::format("synth {} --size tiny --head-dim 512 --no-progress", model));
  INFO(s.err);
  REQUIRE(s.code == 0);

  std::string want_ids, want_logits;
  for (const std::string env : {"K3FLOW_ISA=scalar", "", "K3FLOW_ISA=avx2"}) {
    for (const std::string mode : {"--threads 1", "--threads 2 --incremental"}) {
      CAPTURE(env);
      CAPTURE(mode);
      const Run g = test::k3flow(fmt::format("generate {} --ids 1,2,3 --gen 2 {} --dump-logits {} --out {}",
                                             model, mode, dir / "logits.bin", dir / "run.json"),
                                 env);
      INFO(g.out);
      INFO(g.err);
      REQUIRE(g.signal == 0);
      REQUIRE(g.code == 0);
      const std::string ids = generated_ids(slurp(dir / "run.json")), logits = slurp(dir / "logits.bin");
      REQUIRE(ids.find(',') != std::string::npos);  // two ids
      REQUIRE(!logits.empty());
      if (want_ids.empty()) {
        want_ids = ids;
        want_logits = logits;
        continue;
      }
      CHECK(ids == want_ids);
      CHECK(logits == want_logits);
    }
  }
}
