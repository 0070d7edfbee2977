// The auto strategy's controller against a model of a device: a step costs one figure with expert
// prefetch and another without; the tuner must find the cheaper arm, ignore prefills, measure
// again after `recheck` settled steps, and follow a device that changed under it.
#include <doctest/doctest.h>

#include <string>

#include "pipeline/graph/prefetch_tuner.hpp"

using k3::pipeline::PrefetchTuner;

namespace {

// Runs `steps` decode steps; each costs `on` or `off` seconds by the tuner's choice for it.
// Returns how many of them ran with prefetch.
int run(PrefetchTuner& t, int steps, double on, double off) {
  int with = 0;
  for (int i = 0; i < steps; ++i) {
    const bool p = t.prefetch();
    with += p;
    t.after_call(p ? on : off, 1);
  }
  return with;
}

}  // namespace

TEST_CASE("prefetch tuner: keeps prefetch where it pays, drops it where it costs") {
  for (const bool pays : {true, false}) {
    CAPTURE(pays);
    PrefetchTuner t(PrefetchTuner::Config{.warmup = 1, .samples = 2, .recheck = 10});
    CHECK_FALSE(t.settled());
    CHECK(t.describe().find("still measuring") != std::string::npos);
    // warmup (1) + 2 samples per arm, alternating off, on, off, on
    run(t, 5, pays ? 0.05 : 0.09, 0.07);
    REQUIRE(t.settled());
    CHECK(t.decisions() == 1);
    CHECK(t.prefetch() == pays);
    CHECK(t.steps_on() == 2);
    CHECK(t.steps_off() == 3);
    // settled: every step runs the winner until the re-check
    CHECK(run(t, 9, pays ? 0.05 : 0.09, 0.07) == (pays ? 9 : 0));
    CHECK(t.settled());
    CHECK(t.describe().find(pays ? "expert prefetch on" : "expert prefetch off") != std::string::npos);
  }
}

TEST_CASE("prefetch tuner: prefills are neither timed nor counted; the first decode step is skipped") {
  PrefetchTuner t(PrefetchTuner::Config{.warmup = 1, .samples = 1, .recheck = 100});
  t.after_call(50.0, 16);  // a prompt of 16 tokens: ignored whatever it cost
  CHECK(t.steps_on() + t.steps_off() == 0);
  CHECK_FALSE(t.prefetch());
  t.after_call(9.0, 1);  // warmup: not a sample (it would have made "off" look slow)
  CHECK_FALSE(t.settled());
  CHECK_FALSE(t.prefetch());
  t.after_call(0.2, 1);  // off
  CHECK(t.prefetch());   // alternates
  t.after_call(0.1, 1);  // on
  REQUIRE(t.settled());
  CHECK(t.prefetch());
  t.after_call(30.0, 4);  // a later multi-token call (chat turn): ignored
  CHECK(t.settled());
  CHECK(t.prefetch());
}

TEST_CASE("prefetch tuner: measures again after `recheck` steps and follows a device that changed") {
  PrefetchTuner t(PrefetchTuner::Config{.warmup = 0, .samples = 3, .recheck = 20});
  run(t, 6, 0.05, 0.08);  // prefetch pays
  REQUIRE(t.settled());
  CHECK(t.prefetch());
  // The host gets busy: prefetch now costs. Still settled on "on" until the re-check...
  CHECK(run(t, 19, 0.12, 0.08) == 19);
  CHECK(t.settled());
  // ...which starts with the 20th settled step, measures both arms again and switches.
  run(t, 1 + 6, 0.12, 0.08);
  CHECK(t.settled());
  CHECK(t.decisions() == 2);
  CHECK_FALSE(t.prefetch());
  // Equal costs: the arm that reads fewer bytes (off).
  PrefetchTuner e(PrefetchTuner::Config{.warmup = 0, .samples = 2, .recheck = 5});
  run(e, 4, 0.1, 0.1);
  REQUIRE(e.settled());
  CHECK_FALSE(e.prefetch());
}
