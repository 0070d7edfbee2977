// Test helpers for the stages/ fixture tests: the tiny config and fixture tensors as weight views.
#pragma once
#include <string>
#include <vector>

#include "io/config.hpp"
#include "kernels/weights.hpp"
#include "tests/fixture_json.hpp"

namespace k3::test {

// The tiny flat config every op fixture was generated with (ops/MANIFEST.json).
inline io::ModelConfig tiny_config() {
  return io::load_config(fixture_path("ops/MANIFEST.json"));
}

// A [rows][...] fixture tensor as an f32 matrix view (the tensor must outlive the view).
inline kernels::F32Matrix f32(const Tensor& t) {
  return kernels::F32Matrix{t.data, t.shape[0], t.data.size() / t.shape[0]};
}

}  // namespace k3::test
