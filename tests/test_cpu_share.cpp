// pipeline/bench/cpu_share: spinner threads count the time they do not run, and the floor on a
// token's time when reads cost the compute part of its CPU.
#include <doctest/doctest.h>
#include <sched.h>

#include <atomic>
#include <chrono>
#include <stdexcept>

#include "io/error.hpp"
#include "pipeline/bench/cpu_share.hpp"

using k3::pipeline::attainable_seconds;
using k3::pipeline::CpuShare;
using k3::pipeline::measure_cpu_share;

namespace {

// Pins the calling thread (and so the threads it starts) to one CPU it may run on; restores on exit.
class OneCpu {
 public:
  OneCpu() {
    ok_ = sched_getaffinity(0, sizeof(saved_), &saved_) == 0;
    if (!ok_) return;
    for (int c = 0; c < CPU_SETSIZE; ++c)
      if (CPU_ISSET(c, &saved_)) {
        cpu_set_t one;
        CPU_ZERO(&one);
        CPU_SET(c, &one);
        ok_ = sched_setaffinity(0, sizeof(one), &one) == 0;
        return;
      }
    ok_ = false;
  }
  ~OneCpu() {
    if (ok_) sched_setaffinity(0, sizeof(saved_), &saved_);
  }
  OneCpu(const OneCpu&) = delete;
  OneCpu& operator=(const OneCpu&) = delete;
  bool ok() const { return ok_; }

 private:
  cpu_set_t saved_{};
  bool ok_ = false;
};

void busy_for(double seconds) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  std::atomic<unsigned> sink{0};
  while (std::chrono::steady_clock::now() < end) sink.fetch_add(1, std::memory_order_relaxed);
}

}  // namespace

TEST_CASE("a spinner sharing its one CPU with a busy thread keeps about half of it") {
  const OneCpu pin;
  if (!pin.ok()) {
    MESSAGE("SKIPPED: sched_setaffinity refused here, so no thread can be made to share a CPU");
    return;
  }
  // The spinner inherits the pin; the calling thread, pinned too, computes beside it. Anything else
  // runnable on that CPU (another test, another process) takes its share of both measurements, so
  // the check is the ratio of the two, taken back to back, in up to three tries: a spinner that did
  // not count its lost time reads the same in both and fails all three.
  CpuShare shared, alone;
  double ratio = 1.0;
  for (int attempt = 0; attempt < 3 && ratio >= 0.8; ++attempt) {
    shared = measure_cpu_share(1, [] { busy_for(0.6); });
    alone = measure_cpu_share(1, {}, 0.4);  // the caller sleeps: the CPU is the spinner's
    ratio = alone.share > 0 ? shared.share / alone.share : 1.0;
    MESSAGE("try " << attempt + 1 << ": shared " << shared.share << " (" << shared.gaps << " gaps), alone "
                   << alone.share << ", ratio " << ratio);
  }
  CHECK(shared.threads == 1);
  CHECK(shared.seconds >= 0.6);
  CHECK(alone.seconds >= 0.4);
  // Half, give or take the scheduler and other load on that CPU: CI builds and tests at once, so
  // two or three other runnable processes per CPU (1/(2+n)) are normal there.
  CHECK(shared.share > 0.1);
  CHECK(shared.share < 0.75);
  CHECK(shared.gaps > 0);
  CHECK(shared.longest_gap > k3::pipeline::kGapSeconds);
  CHECK(ratio < 0.8);  // alone: 1 (or 1/(1+n) beside n others); shared: 1/2 (or 1/(2+n))
  // Two spinners on one sleeping caller's CPU share it between them.
  const CpuShare two = measure_cpu_share(2, {}, 0.5);
  INFO("two " << two.share);
  CHECK(two.threads == 2);
  CHECK(two.share < 0.75);
}

TEST_CASE("bad requests are refused, and a failing load stops the spinners") {
  CHECK_THROWS_AS(measure_cpu_share(0, {}, 0.1), k3::io::Error);
  CHECK_THROWS_AS(measure_cpu_share(1, {}, 0.0), k3::io::Error);
  // The load's exception comes out, and the call returns at all: the spinners were told to stop.
  CHECK_THROWS_AS(measure_cpu_share(2, [] { throw std::runtime_error("read failed"); }), std::runtime_error);
  CHECK_FALSE(CpuShare{}.measured());
}

TEST_CASE("the floor on a token's time when reads take part of the compute's CPU") {
  // Nothing lost: plain max(T_io, T_cpu); shares out of range count as 1.
  CHECK(attainable_seconds(0.02, 0.03, 1.0) == doctest::Approx(0.03));
  CHECK(attainable_seconds(0.05, 0.03, 1.0) == doctest::Approx(0.05));
  CHECK(attainable_seconds(0.02, 0.03, 0.0) == doctest::Approx(0.03));
  CHECK(attainable_seconds(0.02, 0.03, 1.5) == doctest::Approx(0.03));
  CHECK(attainable_seconds(0, 0, 0.5) == doctest::Approx(0.0));
  // Compute loses a third of its CPU while reads are in flight and needs longer than the reads: it
  // runs slowed for all of T_io and alone for the rest.
  CHECK(attainable_seconds(0.020, 0.030, 2.0 / 3.0) == doctest::Approx(0.030 + 0.020 / 3.0));
  // The compute fits inside the reads even slowed: the reads set the pace.
  CHECK(attainable_seconds(0.10, 0.05, 0.6) == doctest::Approx(0.10));
  // The two forms meet where T_cpu == cpu_share x T_io.
  CHECK(attainable_seconds(0.10, 0.06, 0.6) == doctest::Approx(0.10));
  CHECK(attainable_seconds(0.10, 0.0601, 0.6) == doctest::Approx(0.1001));
}
