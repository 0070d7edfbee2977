#include "stages/mla.hpp"

#include <fmt/format.h>
#include <tbb/parallel_for.h>

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

size_t attention_mla_scratch(const io::ModelConfig& c, size_t T, size_t cached) {
  const Dims d(c);
  return T * (d.q_lora + d.nh * d.qh + d.kv_lora + d.rope + d.kv_lora + 2 * d.nh * d.vh) +
         2 * d.nh * (cached + T);
}

void attention_mla(const MlaWeights& w, const io::ModelConfig& c, std::span<const float> x, size_t T,
                   size_t cached, MlaCache cache, std::span<float> out, std::span<float> scratch) {
  const Dims d(c);
  if (cached + T > cache.capacity)
    throw io::runtime_error(
        fmt::format("MLA KV cache overflow: position {} but capacity {}", cached + T - 1, cache.capacity));
  Carver cut(scratch);
  std::span<float> cq = cut.take(T * d.q_lora), Q = cut.take(T * d.nh * d.qh);
  std::span<float> ckv = cut.take(T * (d.kv_lora + d.rope)), lat = cut.take(T * d.kv_lora);
  std::span<float> gate = cut.take(T * d.nh * d.vh), o = cut.take(T * d.nh * d.vh);
  std::span<float> probs_all = cut.take(2 * d.nh * (cached + T));

  kernels::matmul(w.q_a, x, T, cq);
  for (size_t t = 0; t < T; ++t)
    kernels::rmsnorm_inplace(cq.subspan(t * d.q_lora, d.q_lora), w.q_a_norm, c.rms_eps);
  kernels::matmul(w.q_b, cq, T, Q);  // per head [q_nope, q_rope]

  kernels::matmul(w.kv_a, x, T, ckv);  // [latent, k_rope]
  for (size_t t = 0; t < T; ++t) {
    const std::span<float> row = ckv.subspan(t * (d.kv_lora + d.rope), d.kv_lora + d.rope);
    // Only the latent part is normed; the rope slot goes to the cache as it is.
    kernels::rmsnorm(row.first(d.kv_lora), w.kv_a_norm, c.rms_eps, lat.subspan(t * d.kv_lora, d.kv_lora));
    std::copy(row.begin() + d.kv_lora, row.end(), cache.rope.begin() + (cached + t) * d.rope);
  }
  // Expanded per-head [k_nope, v] rows go straight into the cache at their positions.
  kernels::matmul(w.kv_b, lat, T, cache.kv.subspan(cached * d.nh * d.kvd, T * d.nh * d.kvd));

  const float scale = 1.0f / std::sqrt(static_cast<float>(d.qh));  // over the full qk_nope+qk_rope width
  const size_t n_pos = cached + T;
  tbb::parallel_for(size_t{0}, d.nh, [&](size_t h) {
    std::span<float> scores = probs_all.subspan(2 * h * n_pos, n_pos);
    std::span<float> probs = probs_all.subspan((2 * h + 1) * n_pos, n_pos);
    for (size_t t = 0; t < T; ++t) {
      const size_t p = cached + t;  // causal: keys 0..p
      const std::span<const float> q = Q.subspan((t * d.nh + h) * d.qh, d.qh);
      for (size_t s = 0; s <= p; ++s) {
        const std::span<const float> kv = cache.kv.subspan((s * d.nh + h) * d.kvd, d.kvd);
        scores[s] = kernels::mla_score(q.first(d.nope), kv.first(d.nope), q.subspan(d.nope, d.rope),
                                       cache.rope.subspan(s * d.rope, d.rope), scale);
      }
      kernels::softmax(scores.first(p + 1), probs.first(p + 1), kernels::SoftmaxSeed::neg_inf);
      std::span<float> oh = o.subspan((t * d.nh + h) * d.vh, d.vh);
      std::fill(oh.begin(), oh.end(), 0.0f);
      for (size_t s = 0; s <= p; ++s)
        kernels::axpy(probs[s], cache.kv.subspan((s * d.nh + h) * d.kvd + d.nope, d.vh), oh);
    }
  });

  // Output gate BEFORE o_proj, no norm.
  if (w.g) {
    kernels::matmul(*w.g, x, T, gate);
    kernels::sigmoid_gate_inplace(o, gate);
  }
  kernels::matmul(w.o, o, T, out.first(T * d.E));
}

}  // namespace k3::stages
