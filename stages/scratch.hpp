// Scratch carving: a stage is handed one span and cuts it into regions that cannot overlap (each
// take() moves past the previous one). Stages publish how many floats they need.
#pragma once
#include <cstddef>
#include <span>
#include <vector>

#include "io/error.hpp"

namespace k3::stages {

class Carver {
 public:
  explicit Carver(std::span<float> all) : rest_(all) {}
  std::span<float> take(size_t n) {
    if (n > rest_.size()) throw io::runtime_error("stages: scratch too small (internal sizing error)");
    std::span<float> s = rest_.first(n);
    rest_ = rest_.subspan(n);
    return s;
  }

 private:
  std::span<float> rest_;
};

// A growable scratch owner for callers that run stages in sequence.
class Scratch {
 public:
  std::span<float> get(size_t n) {
    if (buf_.size() < n) buf_.resize(n);
    return std::span<float>(buf_).first(n);
  }

 private:
  std::vector<float> buf_;
};

}  // namespace k3::stages
