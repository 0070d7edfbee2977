#include "stages/kda.hpp"

#include <tbb/parallel_for.h>

#include "io/error.hpp"
#include "kernels/activations.hpp"
#include "kernels/kda.hpp"
#include "kernels/matmul.hpp"
#include "kernels/norms.hpp"
#include "kernels/shortconv.hpp"
#include "stages/scratch.hpp"

namespace k3::stages {

namespace {
struct Dims {
  size_t E, H, D, P, K;
  explicit Dims(const io::ModelConfig& c)
      : E(c.hidden), H(c.kda_heads), D(c.kda_head_dim), P(H * D), K(c.conv_kernel) {}
};
}  // namespace

size_t kda_state_floats(const io::ModelConfig& c) {
  const Dims d(c);
  return d.H * d.D * d.D + 3 * d.P * (d.K - 1);
}

KdaState kda_state_view(const io::ModelConfig& c, std::span<float> s) {
  const Dims d(c);
  return {s.first(d.H * d.D * d.D), s.subspan(d.H * d.D * d.D, 3 * d.P * (d.K - 1))};
}

size_t attention_kda_scratch(const io::ModelConfig& c, size_t T) {
  const Dims d(c);
  return T * (10 * d.P + d.H + d.D);
}

void kda_recur(const io::ModelConfig& c, std::span<float> S_all, std::span<const float> alpha,
               std::span<const float> k, std::span<const float> v, std::span<const float> beta,
               std::span<const float> q, std::span<float> o, size_t rows) {
  const Dims d(c);
  // Heads are independent, time is sequential.
  tbb::parallel_for(size_t{0}, d.H, [&](size_t h) {
    std::span<float> S = S_all.subspan(h * d.D * d.D, d.D * d.D);
    for (size_t t = 0; t < rows; ++t) {
      const size_t at = t * d.P + h * d.D;
      kernels::kda_step(S, alpha.subspan(at, d.D), k.subspan(at, d.D), v.subspan(at, d.D), beta[t * d.H + h],
                        q.subspan(at, d.D), o.subspan(at, d.D), d.D);
    }
  });
}

void attention_kda(const KdaWeights& w, const io::ModelConfig& c, std::span<const float> x, size_t T,
                   std::span<const KdaSegment> segs, std::span<float> out, std::span<float> scratch) {
  const Dims d(c);
  for (const KdaSegment& s : segs)
    if (s.first_row + s.rows > T)
      throw io::runtime_error("KDA: a segment ends past the pass's rows (internal error)");
  Carver cut(scratch);
  std::span<float> q_raw = cut.take(T * d.P), k_raw = cut.take(T * d.P), v_raw = cut.take(T * d.P);
  std::span<float> q = cut.take(T * d.P), k = cut.take(T * d.P), v = cut.take(T * d.P);
  std::span<float> gate = cut.take(T * d.P), z = cut.take(T * d.P), alpha = cut.take(T * d.P);
  std::span<float> o = cut.take(T * d.P), b = cut.take(T * d.H), fa = cut.take(T * d.D);

  // Projections over ALL the pass's rows, one pass over each weight. kernels::matmul computes row
  // t's dot products exactly as a one-row matvec (each row has its own accumulators with the same
  // lane/tree order, kernels/matmul*.cpp; tests/test_matmul.cpp checks every body), so a row's
  // bits never depend on which other rows share the pass.
  kernels::matmul(w.q, x, T, q_raw);
  kernels::matmul(w.k, x, T, k_raw);
  kernels::matmul(w.v, x, T, v_raw);
  kernels::matmul(w.g, x, T, gate);
  kernels::matmul(w.b, x, T, b);
  kernels::matmul(w.f_a, x, T, fa);  // rank-D bottleneck shared by all heads, no activation
  kernels::matmul(w.f_b, fa, T, z);

  const size_t hist = d.P * (d.K - 1);
  const float q_scale = kernels::kda_q_scale(d.D);
  for (const KdaSegment& s : segs) {
    std::span<float> hq = s.state.conv.first(hist), hk = s.state.conv.subspan(hist, hist),
                     hv = s.state.conv.subspan(2 * hist, hist);
    for (size_t t = s.first_row; t < s.first_row + s.rows; ++t) {
      auto row = [&](std::span<float> a) { return a.subspan(t * d.P, d.P); };
      // ShortConv + SiLU; the history keeps RAW (pre-conv) inputs and is carried across calls.
      kernels::shortconv_step(row(q_raw), w.q_conv, d.K, hq, row(q));
      kernels::shortconv_step(row(k_raw), w.k_conv, d.K, hk, row(k));
      kernels::shortconv_step(row(v_raw), w.v_conv, d.K, hv, row(v));
      // L2Norm (sum of squares) on q and k per head only -- never on v; q then scaled by D^-1/2.
      for (size_t h = 0; h < d.H; ++h) {
        kernels::l2norm_inplace(row(q).subspan(h * d.D, d.D));
        kernels::l2norm_inplace(row(k).subspan(h * d.D, d.D));
      }
      for (float& qi : row(q)) qi = qi * q_scale;
      // Decay: A_log indexed by HEAD; dt_bias added to z before the sigmoid.
      kernels::kda_decay(row(z), w.a_log, w.dt_bias, d.H, d.D, c.gate_lower_bound, {}, row(alpha));
      for (size_t h = 0; h < d.H; ++h)
        b[t * d.H + h] = kernels::sigmoid(b[t * d.H + h]);  // one beta per head
    }
    auto rows = [&](std::span<float> a) { return a.subspan(s.first_row * d.P, s.rows * d.P); };
    kda_recur(c, s.state.S, rows(alpha), rows(k), rows(v), b.subspan(s.first_row * d.H, s.rows * d.H),
              rows(q), rows(o), s.rows);
  }

  // Head-wise RMSNorm FIRST, then the sigmoid output gate, then o_proj (all rows again).
  for (size_t t = 0; t < T; ++t) {
    for (size_t h = 0; h < d.H; ++h)
      kernels::rmsnorm_inplace(o.subspan(t * d.P + h * d.D, d.D), w.o_norm, c.rms_eps);
    kernels::sigmoid_gate_inplace(o.subspan(t * d.P, d.P), gate.subspan(t * d.P, d.P));
  }
  kernels::matmul(w.o, o, T, out.first(T * d.E));
}

void attention_kda(const KdaWeights& w, const io::ModelConfig& c, std::span<const float> x, size_t T,
                   KdaState st, std::span<float> out, std::span<float> scratch) {
  const KdaSegment one{.state = st, .first_row = 0, .rows = T};
  attention_kda(w, c, x, T, std::span(&one, 1), out, scratch);
}

}  // namespace k3::stages
