#include "stages/mla.hpp"

#include <fmt/format.h>
#include <tbb/parallel_for.h>

#include <algorithm>
#include <cmath>

#include "io/error.hpp"
#include "kernels/activations.hpp"
#include "kernels/attention.hpp"
#include "kernels/matmul.hpp"
#include "kernels/norms.hpp"
#include "stages/scratch.hpp"

namespace k3::stages {

namespace {
struct Dims {
  size_t E, nh, nope, rope, vh, qh, kvd, q_lora, kv_lora;
  explicit Dims(const io::ModelConfig& c)
      : E(c.hidden),
        nh(c.mla_heads),
        nope(c.qk_nope),
        rope(c.qk_rope),
        vh(c.v_head),
        qh(nope + rope),
        kvd(nope + vh),
        q_lora(c.q_lora_rank),
        kv_lora(c.kv_lora_rank) {}
};
}  // namespace

size_t mla_kv_floats_per_position(const io::ModelConfig& c) {
  const Dims d(c);
  return d.nh * d.kvd;
}
size_t mla_rope_floats_per_position(const io::ModelConfig& c) {
  return static_cast<size_t>(c.qk_rope);
}

namespace {

// The per-row buffers; the [gate | o] region doubles as the kv_b output of a multi-segment pass
// (gate and o are written only after every segment's rows are in its cache).
size_t row_floats(const Dims& d) {
  return d.q_lora + d.nh * d.qh + d.kv_lora + d.rope + d.kv_lora + std::max(2 * d.nh * d.vh, d.nh * d.kvd);
}

}  // namespace

size_t attention_mla_scratch(const io::ModelConfig& c, size_t T, size_t cached) {
  const Dims d(c);
  return T * row_floats(d) + 2 * d.nh * (cached + T);
}

size_t attention_mla_scratch(const io::ModelConfig& c, std::span<const MlaSegment> segs) {
  const Dims d(c);
  size_t T = 0, n_pos = 0;
  for (const MlaSegment& s : segs) {
    T += s.rows;
    n_pos = std::max(n_pos, s.cached + s.rows);  // segments attend one after another
  }
  return T * row_floats(d) + 2 * d.nh * n_pos;
}

void attention_mla(const MlaWeights& w, const io::ModelConfig& c, std::span<const float> x, size_t T,
                   std::span<const MlaSegment> segs, std::span<float> out, std::span<float> scratch) {
  const Dims d(c);
  size_t n_max = 0;
  for (const MlaSegment& s : segs) {
    if (s.first_row + s.rows > T)
      throw io::runtime_error("MLA: a segment ends past the pass's rows (internal error)");
    if (s.cached + s.rows > s.cache.capacity)
      throw io::runtime_error(fmt::format("MLA KV cache overflow: position {} but capacity {}",
                                          s.cached + s.rows - 1, s.cache.capacity));
    n_max = std::max(n_max, s.cached + s.rows);
  }
  const size_t kvr = d.nh * d.kvd;  // floats of one expanded cache row
  Carver cut(scratch);
  std::span<float> cq = cut.take(T * d.q_lora), Q = cut.take(T * d.nh * d.qh);
  std::span<float> ckv = cut.take(T * (d.kv_lora + d.rope)), lat = cut.take(T * d.kv_lora);
  std::span<float> work = cut.take(T * std::max(2 * d.nh * d.vh, kvr));
  std::span<float> gate = work.first(T * d.nh * d.vh), o = work.subspan(T * d.nh * d.vh, T * d.nh * d.vh);
  std::span<float> probs_all = cut.take(2 * d.nh * n_max);

  // Row-wise projections over ALL the pass's rows. kernels::matmul computes row t's dot products
  // exactly as a one-row matvec (own accumulators, same lane/tree order: kernels/matmul*.cpp,
  // tests/test_matmul.cpp), so a row's bits never depend on the other rows of the pass.
  // q_a and kv_a in one parallel pass over x (the gate's output shares `work` with kv_b's, so it
  // waits until after the attention).
  const kernels::MatmulOut of_x[] = {{&w.q_a, cq}, {&w.kv_a, ckv}};  // ckv: [latent, k_rope]
  kernels::matmul_many(of_x, x, T);
  for (size_t t = 0; t < T; ++t)
    kernels::rmsnorm_inplace(cq.subspan(t * d.q_lora, d.q_lora), w.q_a_norm, c.rms_eps);
  kernels::matmul(w.q_b, cq, T, Q);  // per head [q_nope, q_rope]

  for (size_t t = 0; t < T; ++t) {
    const std::span<float> row = ckv.subspan(t * (d.kv_lora + d.rope), d.kv_lora + d.rope);
    // Only the latent part is normed; the rope slot goes to the cache as it is (below).
    kernels::rmsnorm(row.first(d.kv_lora), w.kv_a_norm, c.rms_eps, lat.subspan(t * d.kv_lora, d.kv_lora));
  }
  for (const MlaSegment& s : segs)
    for (size_t t = 0; t < s.rows; ++t) {
      const std::span<const float> row =
          ckv.subspan((s.first_row + t) * (d.kv_lora + d.rope) + d.kv_lora, d.rope);
      std::copy(row.begin(), row.end(), s.cache.rope.begin() + (s.cached + t) * d.rope);
    }
  // Expanded per-head [k_nope, v] rows: one segment writes straight into its cache; several go
  // through `work` and are copied to each cache at its own positions.
  if (segs.size() == 1) {
    const MlaSegment& s = segs[0];
    kernels::matmul(w.kv_b, lat.subspan(s.first_row * d.kv_lora, s.rows * d.kv_lora), s.rows,
                    s.cache.kv.subspan(s.cached * kvr, s.rows * kvr));
  } else {
    const std::span<float> kvb = work.first(T * kvr);
    kernels::matmul(w.kv_b, lat, T, kvb);
    for (const MlaSegment& s : segs)
      std::copy_n(kvb.begin() + s.first_row * kvr, s.rows * kvr, s.cache.kv.begin() + s.cached * kvr);
  }

  // The only part that mixes rows: each segment attends over its own cache. One parallel region
  // over the heads covers every segment (a head's task walks the segments in order, reusing its
  // probs rows), so a batch's sequences do not each pay a fork and a join.
  const float scale = 1.0f / std::sqrt(static_cast<float>(d.qh));  // over the full qk_nope+qk_rope width
  tbb::parallel_for(size_t{0}, d.nh, [&](size_t h) {
    std::span<float> scores = probs_all.subspan(2 * h * n_max, n_max);
    std::span<float> probs = probs_all.subspan((2 * h + 1) * n_max, n_max);
    for (const MlaSegment& seg : segs) {
      const MlaCache& cache = seg.cache;
      for (size_t t = 0; t < seg.rows; ++t) {
        const size_t p = seg.cached + t, r = seg.first_row + t;  // causal: keys 0..p
        const std::span<const float> q = Q.subspan((r * d.nh + h) * d.qh, d.qh);
        for (size_t s = 0; s <= p; ++s) {
          const std::span<const float> kv = cache.kv.subspan((s * d.nh + h) * d.kvd, d.kvd);
          scores[s] = kernels::mla_score(q.first(d.nope), kv.first(d.nope), q.subspan(d.nope, d.rope),
                                         cache.rope.subspan(s * d.rope, d.rope), scale);
        }
        kernels::softmax(scores.first(p + 1), probs.first(p + 1), kernels::SoftmaxSeed::neg_inf);
        std::span<float> oh = o.subspan((r * d.nh + h) * d.vh, d.vh);
        std::fill(oh.begin(), oh.end(), 0.0f);
        for (size_t s = 0; s <= p; ++s)
          kernels::axpy(probs[s], cache.kv.subspan((s * d.nh + h) * d.kvd + d.nope, d.vh), oh);
      }
    }
  });

  // Output gate BEFORE o_proj, no norm (all rows again).
  if (w.g) {
    kernels::matmul(*w.g, x, T, gate);
    kernels::sigmoid_gate_inplace(o, gate);
  }
  kernels::matmul(w.o, o, T, out.first(T * d.E));
}

void attention_mla(const MlaWeights& w, const io::ModelConfig& c, std::span<const float> x, size_t T,
                   size_t cached, MlaCache cache, std::span<float> out, std::span<float> scratch) {
  const MlaSegment one{.cache = cache, .cached = cached, .first_row = 0, .rows = T};
  attention_mla(w, c, x, T, std::span(&one, 1), out, scratch);
}

}  // namespace k3::stages
