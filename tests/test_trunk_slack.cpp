// pipeline/graph/trunk_slack: the rule that caps the trunk reader's depth while the layer at the head
// of its queue had slack to spare the last time it was computed (docs/performance.md, "Slack caps the
// trunk's depth"); the graph's use of it is exercised by the streaming tests (same bits with and
// without the cap, tests/test_streaming_run.cpp).
#include <doctest/doctest.h>

#include "pipeline/graph/trunk_slack.hpp"

using k3::pipeline::TrunkSlack;

TEST_CASE("no cap until a queued layer is known to have had slack") {
  TrunkSlack s(8, TrunkSlack::Config{.cap = 1, .min_slack_s = 2e-3, .read_share = 0.5});
  CHECK(s.cap() == 0);                      // nothing queued
  CHECK(s.read_submitted(3) == 0);          // layer 3 never computed: assume it is needed at once
  CHECK(s.read_landed(3, 0.010) == 0);      // 10 ms to read; the queue is empty again
  CHECK(s.compute_started(3, 0.020) == 0);  // 20 ms of slack, but nothing is being read
  CHECK(s.read_submitted(3) == 1);          // next token: its read may go slowly
  CHECK(s.cap() == 1);
}

TEST_CASE("the slack must exceed both the floor and a share of the layer's last read") {
  TrunkSlack s(4, TrunkSlack::Config{.cap = 2, .min_slack_s = 2e-3, .read_share = 0.5});
  s.read_submitted(1);
  s.read_landed(1, 0.030);      // 30 ms to read
  s.compute_started(1, 0.010);  // 10 ms of slack < 15 ms: a capped read could make the compute wait
  CHECK(s.read_submitted(1) == 0);
  s.read_landed(1, 0.030);
  s.compute_started(1, 0.016);  // 16 ms >= 15 ms
  CHECK(s.read_submitted(1) == 2);
  s.read_landed(1, 0.002);  // a fast read: 1 ms share, but the 2 ms floor still applies
  s.compute_started(1, 0.0015);
  CHECK(s.read_submitted(1) == 0);
}

TEST_CASE("the cap follows the layer at the head of the queue, and a waited-for layer lifts it") {
  TrunkSlack s(16, TrunkSlack::Config{.cap = 1, .min_slack_s = 2e-3, .read_share = 0.5});
  // One token: layer 7 had slack, layer 11 was waited for.
  for (int l : {7, 11}) {
    s.read_submitted(l);
    s.read_landed(l, 0.020);
  }
  s.compute_started(7, 0.030);
  s.compute_started(11, 0.0);
  // The next token queues both: 7 at the head reads capped, then 11 uncapped.
  CHECK(s.read_submitted(7) == 1);
  CHECK(s.read_submitted(11) == 1);     // still 7's read at the head
  CHECK(s.read_landed(7, 0.025) == 0);  // 11 at the head now
  CHECK(s.read_landed(11, 0.020) == 0);
  // Layer 7 is waited for this time: its next read is uncapped too.
  CHECK(s.compute_started(7, 0.0001) == 0);
  CHECK(s.read_submitted(7) == 0);
}

TEST_CASE("cap 0 never caps; layers out of range are ignored") {
  TrunkSlack off(4, TrunkSlack::Config{.cap = 0});
  off.read_submitted(0);
  off.read_landed(0, 0.001);
  off.compute_started(0, 1.0);
  CHECK(off.read_submitted(0) == 0);
  TrunkSlack s(2, TrunkSlack::Config{.cap = 1});
  CHECK(s.read_submitted(5) == 0);
  CHECK(s.read_landed(-1, 0.1) == 0);
  CHECK(s.compute_started(9, 1.0) == 0);
  CHECK(s.cap() == 0);
}
