#include "pipeline/support/human_bytes.hpp"

#include <fmt/format.h>

#include <cmath>

namespace k3::pipeline {

std::string human_bytes(double b) {
  constexpr double kKiB = 1024.0, kMiB = kKiB * 1024, kGiB = kMiB * 1024, kTiB = kGiB * 1024;
  if (!std::isfinite(b) || b < 0) return fmt::format("{} B", b);
  if (b >= kTiB) return fmt::format("{:.2f} TiB", b / kTiB);
  if (b >= kGiB) return fmt::format("{:.2f} GiB", b / kGiB);
  if (b >= kMiB) return fmt::format("{:.2f} MiB", b / kMiB);
  if (b >= kKiB) return fmt::format("{:.2f} KiB", b / kKiB);
  return fmt::format("{:.0f} B", b);
}

std::string gib(double b) {
  return fmt::format("{:.2f} GiB", b / double(uint64_t{1} << 30));
}

std::string human_rate(double bps) {
  const double gbps = bps / 1e9;
  if (gbps >= 1 || gbps == 0) return fmt::format("{:.2f} GB/s", gbps);
  return fmt::format("{:.3f} GB/s", gbps);
}

}  // namespace k3::pipeline
