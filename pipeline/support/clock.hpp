// Seconds on the monotonic clock, for the wall times commands report (per-token latency, the
// device probe's windows). Only differences between two readings mean anything.
#pragma once
#include <chrono>

namespace k3::pipeline {

inline double now_seconds() {
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}

}  // namespace k3::pipeline
