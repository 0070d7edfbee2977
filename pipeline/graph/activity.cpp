#include "pipeline/graph/activity.hpp"

#include "pipeline/graph/trace.hpp"

namespace k3::pipeline {

double Activity::clock() {
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}

Activity::Activity() : last_(clock()) {}

void Activity::advance(double now) {
  const double dt = now - last_;
  if (reads_ > 0) {
    io_busy_ += dt;
    if (in_step_) step_io_ += dt;
  }
  if (computing_ > 0) {
    compute_busy_ += dt;
    if (in_step_) step_compute_ += dt;
  } else if (reads_ > 0 && in_step_) {
    step_wait_ += dt;
  }
  last_ = now;
}

void Activity::read_begin(uint64_t bytes, bool expert) {
  std::lock_guard lk(mu_);
  advance(clock());
  ++reads_;
  in_flight_bytes_ += bytes;
  (expert ? expert_bytes_ : trunk_bytes_) += bytes;
  if (in_step_)
    (expert ? step_expert_ : step_trunk_) += bytes;
  else  // begun between steps (the ring reads ahead while the driver samples): the next step's
    (expert ? next_expert_ : next_trunk_) += bytes;
  if (Trace::enabled()) Trace::counter("bytes in flight", int64_t(in_flight_bytes_));
}

void Activity::read_end(uint64_t bytes) {
  std::lock_guard lk(mu_);
  advance(clock());
  --reads_;
  in_flight_bytes_ -= bytes;
  if (Trace::enabled()) Trace::counter("bytes in flight", int64_t(in_flight_bytes_));
}

void Activity::compute_begin() {
  std::lock_guard lk(mu_);
  advance(clock());
  ++computing_;
}

void Activity::compute_end() {
  std::lock_guard lk(mu_);
  advance(clock());
  --computing_;
}

void Activity::step_begin() {
  std::lock_guard lk(mu_);
  const double now = clock();
  advance(now);
  in_step_ = true;
  step_start_ = now;
  step_wait_ = step_compute_ = step_io_ = 0;
  step_trunk_ = next_trunk_;
  step_expert_ = next_expert_;
  next_trunk_ = next_expert_ = 0;
}

StepStats Activity::step_end() {
  std::lock_guard lk(mu_);
  const double now = clock();
  advance(now);
  in_step_ = false;
  return StepStats{now - step_start_, step_wait_, step_compute_, step_io_, step_trunk_, step_expert_};
}

double Activity::io_busy_seconds() {
  std::lock_guard lk(mu_);
  advance(clock());
  return io_busy_;
}

double Activity::compute_busy_seconds() {
  std::lock_guard lk(mu_);
  advance(clock());
  return compute_busy_;
}

uint64_t Activity::trunk_bytes() const {
  std::lock_guard lk(mu_);
  return trunk_bytes_;
}

uint64_t Activity::expert_bytes() const {
  std::lock_guard lk(mu_);
  return expert_bytes_;
}

}  // namespace k3::pipeline
