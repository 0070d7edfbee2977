// The `auto` strategy's controller: whether the next decode step prefetches the next layer's
// predicted experts (the lookahead strategy) or not (the overlap strategy), chosen from what the
// steps of this very run cost.
//
// Why measure instead of a rule: which of the two is faster depends on the device, the budget and
// the model. A prefetch hides an expert read behind the previous layer's compute when the router's
// guess is right and the disk has time to spare; when the disk is the bottleneck, or the guess is
// wrong, it spends bandwidth the trunk needed. Measured with the same binary on one machine: the
// `wide` profile (16 layers, 512 experts top-1) had lookahead the slowest of four strategies at
// 2 threads on a fast device (0.0951 vs 0.0711 s/token) and the best at 1 thread on a slow one; the
// peer checkpoint (26 layers, 8 experts top-2) had them within 3 %. The two share one graph (the
// lookahead node simply does not prefetch), so switching costs nothing and the bits are the same.
//
// How: decode steps (one token each) alternate prefetch off / on until each arm has `samples`
// steps; the arm with the lower median s/token wins (ties: off, which reads fewer bytes). After
// `recheck` settled steps it measures again: the expert cache warms up and the host's load
// changes. Prefill calls (several tokens) are not timed and do not advance the schedule; the first
// `warmup` decode steps are skipped (their reads ran ahead from the prefill).
#pragma once
#include <cstddef>
#include <string>
#include <vector>

namespace k3::pipeline {

class PrefetchTuner {
 public:
  struct Config {
    int warmup = 1;    // decode steps skipped before the first measurement
    int samples = 2;   // steps per arm in one measurement
    int recheck = 48;  // settled steps before measuring again
  };
  PrefetchTuner();
  explicit PrefetchTuner(Config c);

  bool prefetch() const { return on_; }  // for the next call
  // The call just made (with prefetch() as it was) took `seconds` for `tokens` tokens.
  void after_call(double seconds, size_t tokens);

  bool settled() const { return settled_; }
  int decisions() const { return decisions_; }  // measurements completed
  int steps_on() const { return steps_on_; }    // decode steps run with prefetch on
  int steps_off() const { return steps_off_; }
  // One line for the run's summary: the last decision and the medians it was made on.
  std::string describe() const;

 private:
  void start_measuring();
  Config c_;
  bool on_ = false, settled_ = false;
  int skip_ = 0, since_settled_ = 0, decisions_ = 0, steps_on_ = 0, steps_off_ = 0;
  std::vector<double> on_s_, off_s_;
  double last_on_ = 0, last_off_ = 0;  // medians behind the last decision
};

}  // namespace k3::pipeline
