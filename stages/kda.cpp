#include "stages/kda.hpp"

#include <tbb/parallel_for.h>

#include <algorithm>
#include <vector>

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
  return {.S = s.first(d.H * d.D * d.D),
          .conv = s.subspan(d.H * d.D * d.D, 3 * d.P * (d.K - 1)),
          .journal = nullptr};
}

size_t kda_journal_row_floats(const io::ModelConfig& c) {
  const Dims d(c);
  return 7 * d.P + d.H;
}

namespace {

// A journal's blocks: raw q, k, v | q, k, v, alpha ([capacity][P] each) | beta ([capacity][H]).
struct JournalBlocks {
  std::span<float> raw[3], q, k, v, alpha, beta;
  JournalBlocks(const Dims& d, const KdaJournal& j) {
    const size_t n = j.capacity_rows * d.P;
    Carver cut(j.rows);
    for (std::span<float>& r : raw) r = cut.take(n);
    q = cut.take(n), k = cut.take(n), v = cut.take(n), alpha = cut.take(n);
    beta = cut.take(j.capacity_rows * d.H);
  }
};

// A ShortConv history ([P][K-1], oldest first) after `n` more raw inputs ([n][P]): per channel the
// last K-1 of old ++ new. Pure data movement, shortconv_step's own shift.
void advance_history(std::span<float> hist, size_t P, size_t K, std::span<const float> raw, size_t n) {
  const size_t W = K - 1;
  if (W == 0) return;
  for (size_t ch = 0; ch < P; ++ch) {
    float* h = hist.data() + ch * W;
    for (size_t t = 0; t < n; ++t) {
      for (size_t j = 0; j + 1 < W; ++j) h[j] = h[j + 1];
      h[W - 1] = raw[t * P + ch];
    }
  }
}

}  // namespace

void kda_rollback(const io::ModelConfig& c, KdaState st, const KdaJournal& jr, size_t keep) {
  const Dims d(c);
  if (keep > jr.used_rows || jr.before.size() != st.S.size() + st.conv.size())
    throw io::runtime_error("kda_rollback: the journal does not cover the rows kept (internal error)");
  std::copy(jr.before.begin(), jr.before.begin() + std::ptrdiff_t(st.S.size()), st.S.begin());
  std::copy(jr.before.begin() + std::ptrdiff_t(st.S.size()), jr.before.end(), st.conv.begin());
  if (keep == 0) return;
  const JournalBlocks j(d, jr);
  const size_t hist = d.P * (d.K - 1), n = keep * d.P;
  for (size_t i = 0; i < 3; ++i) advance_history(st.conv.subspan(i * hist, hist), d.P, d.K, j.raw[i], keep);
  std::vector<float> o(n);  // the output is not wanted: the pass produced it
  kda_recur(c, st.S, j.alpha.first(n), j.k.first(n), j.v.first(n), j.beta.first(keep * d.H), j.q.first(n), o,
            keep);
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
  // bits never depend on which other rows share the pass. The six projections of x go in one
  // parallel pass (matmul_many: one widening of x, one fork and join).
  const kernels::MatmulOut of_x[] = {
      {&w.q, q_raw}, {&w.k, k_raw}, {&w.v, v_raw},
      {&w.g, gate},  {&w.b, b},     {&w.f_a, fa}};  // f_a: rank-D bottleneck shared by all heads
  kernels::matmul_many(of_x, x, T);
  kernels::matmul(w.f_b, fa, T, z);

  const size_t hist = d.P * (d.K - 1);
  const float q_scale = kernels::kda_q_scale(d.D);
  // What carries a sequence's state, per segment. Segments share no state and write disjoint rows,
  // so a batched pass runs them at once (each recurrence still splits its heads over the threads).
  auto segment = [&](const KdaSegment& s) {
    KdaJournal* jr = s.state.journal;
    if (jr) {  // a verify pass: the state on entry (kda_rollback)
      if (s.rows > jr->capacity_rows || jr->before.size() != s.state.S.size() + s.state.conv.size())
        throw io::runtime_error("KDA: the journal is smaller than the pass (internal error)");
      std::copy(s.state.S.begin(), s.state.S.end(), jr->before.begin());
      std::copy(s.state.conv.begin(), s.state.conv.end(),
                jr->before.begin() + std::ptrdiff_t(s.state.S.size()));
      jr->used_rows = s.rows;
    }
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
    if (jr) {  // ... and the rows' recurrence inputs (copies: no computed bit changes)
      const JournalBlocks j(d, *jr);
      const size_t n = s.rows * d.P;
      const std::span<float> from[] = {rows(q_raw), rows(k_raw), rows(v_raw), rows(q),
                                       rows(k),     rows(v),     rows(alpha)};
      const std::span<float> to[] = {j.raw[0], j.raw[1], j.raw[2], j.q, j.k, j.v, j.alpha};
      for (size_t i = 0; i < 7; ++i) std::copy_n(from[i].begin(), n, to[i].begin());
      std::copy_n(b.begin() + std::ptrdiff_t(s.first_row * d.H), s.rows * d.H, j.beta.begin());
    }
    kda_recur(c, s.state.S, rows(alpha), rows(k), rows(v), b.subspan(s.first_row * d.H, s.rows * d.H),
              rows(q), rows(o), s.rows);
  };
  if (segs.size() == 1) {
    segment(segs[0]);
  } else {
    tbb::parallel_for(size_t{0}, segs.size(), [&](size_t i) { segment(segs[i]); });
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
