#include "kernels/argmax.hpp"

#include <limits>

namespace k3::kernels {

size_t argmax(std::span<const float> x) {
  size_t best = 0;
  float m = -std::numeric_limits<float>::infinity();
  for (size_t i = 0; i < x.size(); ++i) {
    if (x[i] > m) {  // strict: the first maximum wins
      m = x[i];
      best = i;
    }
  }
  return best;
}

}  // namespace k3::kernels
