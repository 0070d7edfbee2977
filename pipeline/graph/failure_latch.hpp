// The streaming run's failure latch: the first failure's message wins and later ones are dropped;
// once set it stays set for the run. Any thread may set it (a node body's exception, a failed read's
// completion); node bodies check it to skip their work, and the driver (forward_batch) reads the
// message to throw it. Owned by StreamingModel::Impl (graph_impl.hpp), whose fail() also closes the
// forward call in progress (CallGate).
#pragma once
#include <atomic>
#include <mutex>
#include <string>

namespace k3::pipeline {

class FailureLatch {
 public:
  // Records `msg` unless a failure is already recorded.
  void set(const std::string& msg) {
    std::lock_guard lk(mu_);
    if (!failed_.load()) {
      msg_ = msg;
      failed_.store(true);
    }
  }
  bool failed(std::memory_order order = std::memory_order_seq_cst) const { return failed_.load(order); }
  // The first failure's message; read it only after failed() returned true.
  const std::string& message() const { return msg_; }

 private:
  std::atomic<bool> failed_{false};
  std::mutex mu_;
  std::string msg_;
};

}  // namespace k3::pipeline
