#include "pipeline/bench/cpu_share.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "io/error.hpp"

namespace k3::pipeline {

namespace {

struct SpinResult {
  double lost = 0, longest = 0;
  long gaps = 0;
};

void spin(const std::atomic<bool>& stop, SpinResult& out) {
  using clock = std::chrono::steady_clock;
  auto last = clock::now();
  SpinResult r;
  while (!stop.load(std::memory_order_relaxed)) {
    const auto t = clock::now();
    const double step = std::chrono::duration<double>(t - last).count();
    if (step > kGapSeconds) {
      r.lost += step;
      r.longest = std::max(r.longest, step);
      ++r.gaps;
    }
    last = t;
  }
  out = r;
}

}  // namespace

CpuShare measure_cpu_share(int threads, const std::function<void()>& beside, double seconds) {
  if (threads < 1) throw io::usage_error(fmt::format("CPU share: {} spinner threads (at least 1)", threads));
  if (!beside && !(seconds > 0))
    throw io::usage_error(fmt::format("CPU share: {} seconds to spin (more than 0)", seconds));
  std::atomic<bool> stop{false};
  std::vector<SpinResult> res(static_cast<size_t>(threads));
  std::vector<std::thread> spinners;
  spinners.reserve(size_t(threads));
  auto finish = [&] {
    stop.store(true, std::memory_order_relaxed);
    for (std::thread& t : spinners) t.join();
  };
  const auto t0 = std::chrono::steady_clock::now();
  try {  // a thread that cannot start, or a load that throws: the started spinners still stop
    for (int i = 0; i < threads; ++i) spinners.emplace_back(spin, std::cref(stop), std::ref(res[size_t(i)]));
    if (beside)
      beside();
    else
      std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  } catch (...) {
    finish();
    throw;
  }
  finish();
  CpuShare c;
  c.threads = threads;
  c.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  double lost = 0;
  for (const SpinResult& r : res) {
    lost += r.lost;
    c.longest_gap = std::max(c.longest_gap, r.longest);
    c.gaps += r.gaps;
  }
  c.share = c.seconds > 0 ? std::clamp(1.0 - lost / (double(threads) * c.seconds), 0.0, 1.0) : 0.0;
  return c;
}

double attainable_seconds(double t_io, double t_cpu, double cpu_share) {
  const double c = cpu_share > 0 && cpu_share <= 1 ? cpu_share : 1.0;
  t_io = std::max(t_io, 0.0);
  t_cpu = std::max(t_cpu, 0.0);
  if (t_cpu <= c * t_io) return t_io;
  return t_cpu + (1 - c) * t_io;
}

}  // namespace k3::pipeline
