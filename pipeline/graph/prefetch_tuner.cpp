#include "pipeline/graph/prefetch_tuner.hpp"

#include <fmt/format.h>

#include <algorithm>

namespace k3::pipeline {

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n == 0 ? 0.0 : n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

}  // namespace

PrefetchTuner::PrefetchTuner() : PrefetchTuner(Config{}) {}

PrefetchTuner::PrefetchTuner(Config c) : c_(c) {
  c_.samples = std::max(1, c_.samples);
  c_.recheck = std::max(1, c_.recheck);
  skip_ = std::max(0, c_.warmup);
  start_measuring();
}

void PrefetchTuner::start_measuring() {
  settled_ = false;
  on_s_.clear();
  off_s_.clear();
  on_ = false;  // each measurement starts with the arm that reads less
}

void PrefetchTuner::after_call(double seconds, size_t tokens) {
  if (tokens != 1) return;  // a prefill: neither timed nor counted
  (on_ ? steps_on_ : steps_off_) += 1;
  if (skip_ > 0) {
    --skip_;
    return;
  }
  if (settled_) {
    if (++since_settled_ >= c_.recheck) start_measuring();
    return;
  }
  (on_ ? on_s_ : off_s_).push_back(seconds);
  const size_t want = size_t(c_.samples);
  if (on_s_.size() >= want && off_s_.size() >= want) {
    last_on_ = median(on_s_);
    last_off_ = median(off_s_);
    on_ = last_on_ < last_off_;
    settled_ = true;
    since_settled_ = 0;
    ++decisions_;
    return;
  }
  on_ = on_s_.size() < off_s_.size();  // alternate: the arm with fewer samples next
}

std::string PrefetchTuner::describe() const {
  if (decisions_ == 0)
    return fmt::format("auto: still measuring ({} steps with expert prefetch, {} without)", steps_on_,
                       steps_off_);
  return fmt::format(
      "auto: expert prefetch {} (median {:.4f} s/token with, {:.4f} without; {} measurement{}; {} steps with "
      "prefetch, {} without)",
      last_on_ < last_off_ ? "on" : "off", last_on_, last_off_, decisions_, decisions_ == 1 ? "" : "s",
      steps_on_, steps_off_);
}

}  // namespace k3::pipeline
