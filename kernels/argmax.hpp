#pragma once
#include <cstddef>
#include <span>

namespace k3::kernels {

// First index of the maximum (strict > scan from 0).
size_t argmax(std::span<const float> x);

}  // namespace k3::kernels
