// --threads N, as every command that computes takes it: one object caps oneTBB's workers for the
// process while it lives, and its threads() is the value the command passes down (StreamFlags::threads
// sizes the streamed graph's arena; the run report prints it). Nothing reads the cap back.
#pragma once
#include <tbb/global_control.h>
#include <tbb/info.h>

#include <cstddef>
#include <optional>

namespace k3::pipeline {

class ThreadLimit {
 public:
  // threads <= 0: no cap, every core oneTBB sees.
  explicit ThreadLimit(int threads) : threads_(threads > 0 ? threads : tbb::info::default_concurrency()) {
    if (threads > 0) cap_.emplace(tbb::global_control::max_allowed_parallelism, static_cast<size_t>(threads));
  }
  ThreadLimit(const ThreadLimit&) = delete;
  ThreadLimit& operator=(const ThreadLimit&) = delete;

  // The threads work may use while this object lives.
  int threads() const { return threads_; }

 private:
  int threads_;
  std::optional<tbb::global_control> cap_;
};

}  // namespace k3::pipeline
