// pipeline/graph/activity: the run report's per-step accounting -- which step a read's bytes belong to
// (reads that begin between steps, as the trunk ring's do while the driver samples, count to the
// next step: none is lost, none counted twice), and io-wait vs compute time inside a step.
#include <doctest/doctest.h>

#include <chrono>
#include <thread>

#include "pipeline/graph/activity.hpp"

using k3::pipeline::Activity;
using k3::pipeline::StepStats;

namespace {
void sleep_ms(int ms) {
  std::this_thread::sleep_for(std::chrono::milliseconds(ms));
}
}  // namespace

TEST_CASE("a step's bytes: read in it, or begun since the previous step ended") {
  Activity a;
  a.step_begin();
  a.read_begin(100, false);
  a.read_begin(7, true);
  const StepStats s0 = a.step_end();
  CHECK(s0.trunk_bytes == 100);
  CHECK(s0.expert_bytes == 7);

  a.read_begin(40, false);  // between steps: the ring reading ahead for the next token
  a.read_begin(3, true);
  a.read_end(100);
  a.step_begin();
  a.read_begin(60, false);
  const StepStats s1 = a.step_end();
  CHECK(s1.trunk_bytes == 100);  // 40 begun before it + 60 in it
  CHECK(s1.expert_bytes == 3);

  a.step_begin();
  const StepStats s2 = a.step_end();  // nothing new: nothing counted twice
  CHECK(s2.trunk_bytes == 0);
  CHECK(s2.expert_bytes == 0);
  CHECK(a.trunk_bytes() == 200);
  CHECK(a.expert_bytes() == 10);
}

TEST_CASE("inside a step, a read with no compute running is io-wait; compute is compute") {
  Activity a;
  a.step_begin();
  a.read_begin(1, false);
  sleep_ms(20);  // waiting on the read
  a.compute_begin();
  sleep_ms(20);  // computing while it is still in flight: not waiting
  a.compute_end();
  a.read_end(1);
  const StepStats s = a.step_end();
  CHECK(s.io_wait_seconds >= 0.015);
  CHECK(s.compute_seconds >= 0.015);
  CHECK(s.io_wait_seconds < s.wall_seconds);
  CHECK(s.io_wait_seconds + s.compute_seconds <= s.wall_seconds + 1e-9);
}
