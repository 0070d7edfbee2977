#include "pipeline/human_bytes.hpp"

#include <fmt/format.h>

namespace k3::pipeline {

std::string human_bytes(double b) {
  const char* unit[] = {"B", "KB", "MB", "GB", "TB"};
  int i = 0;
  while (b >= 1000.0 && i < 4) {
    b /= 1000.0;
    ++i;
  }
  return fmt::format("{:.2f} {}", b, unit[i]);
}

}  // namespace k3::pipeline
