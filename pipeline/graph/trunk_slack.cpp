#include "pipeline/graph/trunk_slack.hpp"

#include <algorithm>

#include "io/env.hpp"

namespace k3::pipeline {

TrunkSlack::TrunkSlack(int layers, Config c)
    : c_(c), slack_(size_t(std::max(layers, 0)), 0.0), read_(size_t(std::max(layers, 0)), 0.0) {}

unsigned TrunkSlack::cap_locked() const {
  if (c_.cap == 0 || queued_.empty()) return 0;
  const size_t l = size_t(queued_.front());
  const double s = slack_[l];
  return s >= c_.min_slack_s && s >= c_.read_share * read_[l] ? c_.cap : 0;
}

unsigned TrunkSlack::read_submitted(int layer) {
  std::lock_guard lk(mu_);
  if (size_t(layer) < slack_.size()) queued_.push_back(layer);
  return cap_locked();
}

unsigned TrunkSlack::read_landed(int layer, double read_s) {
  std::lock_guard lk(mu_);
  if (size_t(layer) < read_.size()) read_[size_t(layer)] = read_s;
  if (auto it = std::find(queued_.begin(), queued_.end(), layer); it != queued_.end()) queued_.erase(it);
  return cap_locked();
}

unsigned TrunkSlack::compute_started(int layer, double slack_s) {
  std::lock_guard lk(mu_);
  if (size_t(layer) < slack_.size()) slack_[size_t(layer)] = slack_s;
  return cap_locked();
}

unsigned TrunkSlack::cap() const {
  std::lock_guard lk(mu_);
  return cap_locked();
}

TrunkSlack::Config trunk_slack_config() {
  TrunkSlack::Config c;
  if (auto q = io::env::integer(io::env::kTrunkSlackQd)) c.cap = unsigned(std::max(0, *q));
  return c;
}

}  // namespace k3::pipeline
