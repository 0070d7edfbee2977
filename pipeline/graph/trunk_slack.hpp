// The trunk reader's depth from the compute's point of view (docs/performance.md, "Slack caps the
// trunk's depth"). The device serves reads about in order, so an expert read the compute waits for
// lands only after every trunk chunk already in the device queue. A trunk layer whose compute starts
// long after it was bound can be read with a shallow window at no cost, and the expert reads then
// wait behind less; a layer the compute waited for needs every chunk in flight the depth tuner chose.
// Which it is repeats token after token (the streamed layers sit at the same places between pinned
// ones), so TrunkSlack remembers each layer's slack from its last compute and caps the reader while
// the layer at the head of its queue had slack to spare: at least `min_slack_s`, and at least
// `read_share` of that layer's last read time (a capped read takes longer; the slack must cover it).
#pragma once
#include <deque>
#include <mutex>
#include <vector>

namespace k3::pipeline {

class TrunkSlack {
 public:
  struct Config {
    unsigned cap = 1;           // chunks in flight while the head layer has slack (0: never cap)
    double min_slack_s = 2e-3;  // less slack than this: the layer is behind
    double read_share = 0.5;    // ... or less than this share of its last read time
  };
  TrunkSlack(int layers, Config c);
  // Each returns the cap the trunk reader should have now (0: none). Any thread.
  unsigned read_submitted(int layer);                   // a read of `layer` queued
  unsigned read_landed(int layer, double read_s);       // ... landed, `read_s` after it was queued
  unsigned compute_started(int layer, double slack_s);  // its compute began `slack_s` after binding
  unsigned cap() const;

 private:
  unsigned cap_locked() const;
  Config c_;
  mutable std::mutex mu_;
  std::vector<double> slack_, read_;  // per layer: the last compute's slack, the last read's time
  std::deque<int> queued_;            // layers read, in submission order, not landed yet
};

// The rule the streaming graph uses: K3FLOW_TRUNK_SLACK_QD sets the cap (default 1; 0: off).
TrunkSlack::Config trunk_slack_config();

}  // namespace k3::pipeline
