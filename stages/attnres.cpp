#include "stages/attnres.hpp"

#include <algorithm>
#include <vector>

#include "io/error.hpp"
#include "kernels/attnres.hpp"
#include "stages/scratch.hpp"

namespace k3::stages {

BlockStack::BlockStack(std::span<float> storage, size_t capacity, size_t T, size_t hidden)
    : data_(storage.first(capacity * T * hidden)), cap_(capacity), T_(T), E_(hidden) {}

void BlockStack::push(std::span<const float> prefix) {
  if (n_ >= cap_) throw io::runtime_error("attention-residual block stack overflow (internal sizing error)");
  std::copy_n(prefix.begin(), T_ * E_, data_.begin() + n_ * T_ * E_);
  ++n_;
}

size_t attnres_scratch(const io::ModelConfig& c, size_t n_blocks) {
  return static_cast<size_t>(c.hidden) + n_blocks + 1;
}

void attnres_stage(const BlockStack& blocks, std::span<const float> prefix, Vec norm, Vec proj,
                   const io::ModelConfig& c, size_t t_begin, size_t t_end, std::span<float> out,
                   std::span<float> scratch) {
  const size_t E = static_cast<size_t>(c.hidden), n = blocks.size();
  Carver cut(scratch);
  std::span<float> fold = cut.take(E), scores = cut.take(n + 1);
  kernels::attnres_fold(norm, proj, fold);
  std::vector<std::span<const float>> sources(n + 1);
  for (size_t t = t_begin; t < t_end; ++t) {
    for (size_t b = 0; b < n; ++b) sources[b] = blocks.block(b, t);
    sources[n] = prefix.subspan(t * E, E);
    kernels::attnres(sources, fold, c.rms_eps, scores, out.subspan((t - t_begin) * E, E));
  }
}

}  // namespace k3::stages
