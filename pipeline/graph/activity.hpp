// Wall-clock accounting of one streamed run (the run report's io_busy / compute_busy / io_wait):
// two counters -- reads in flight and compute nodes running -- and the time each spent non-zero,
// advanced at every change. io_wait is the time inside a step when a read was in flight and no
// compute node ran (compute waiting on I/O). A step's bytes are those whose read began in it or
// since the step before it ended (the trunk ring reads ahead across tokens while the driver
// samples). Also emits the trace's counters. One mutex; it is taken a few times per read and per
// node run, never per weight.
#pragma once
#include <chrono>
#include <cstdint>
#include <mutex>

namespace k3::pipeline {

struct StepStats {
  double wall_seconds = 0, io_wait_seconds = 0, compute_seconds = 0;
  double io_busy_seconds = 0;  // of the step's wall time, with a read in flight
  uint64_t trunk_bytes = 0, expert_bytes = 0;
};

class Activity {
 public:
  Activity();
  void read_begin(uint64_t bytes, bool expert);
  void read_end(uint64_t bytes);
  void compute_begin();
  void compute_end();

  void step_begin();
  StepStats step_end();

  double io_busy_seconds();
  double compute_busy_seconds();
  uint64_t trunk_bytes() const;
  uint64_t expert_bytes() const;

 private:
  void advance(double now);  // caller holds mu_
  static double clock();

  mutable std::mutex mu_;
  int reads_ = 0, computing_ = 0;
  bool in_step_ = false;
  double last_ = 0, step_start_ = 0;
  double io_busy_ = 0, compute_busy_ = 0;
  double step_wait_ = 0, step_compute_ = 0, step_io_ = 0;
  uint64_t in_flight_bytes_ = 0, trunk_bytes_ = 0, expert_bytes_ = 0, step_trunk_ = 0, step_expert_ = 0;
  uint64_t next_trunk_ = 0, next_expert_ = 0;  // begun between steps: counted to the next one
};

}  // namespace k3::pipeline
