// The end of a forward call in the streaming graph: the driver (forward_batch) opens a call, waits
// until it is closed, and the head node (after writing the logits) or a failure (Impl::fail) closes
// it. Owned by StreamingModel::Impl (graph_impl.hpp). The wait is on a task_group the open call
// holds, not flow::graph::wait_for_all(): that also waits for reads already in flight for the next
// call, and the next token's resident layers could be computing by then.
#pragma once
#include <tbb/task_arena.h>
#include <tbb/task_group.h>

#include <mutex>

#include "pipeline/graph/failure_latch.hpp"

namespace k3::pipeline {

class CallGate {
 public:
  // Opens a forward call (false: the run has already failed, and nothing is opened).
  bool open(const FailureLatch& failure) {
    std::lock_guard lk(mu_);
    if (failure.failed()) return false;
    open_ = group_.defer([] {});
    return true;
  }
  // Closes the call (again: nothing to do).
  void end() {
    std::lock_guard lk(mu_);
    open_ = tbb::task_handle{};  // dropping the handle releases group_'s wait
  }
  // Returns when the call is closed; waits inside `arena`, so the waiting thread runs the graph's
  // tasks meanwhile (as it must with one thread).
  void wait(tbb::task_arena& arena) {
    arena.execute([&] { group_.wait(); });
  }

 private:
  std::mutex mu_;
  tbb::task_group group_;
  tbb::task_handle open_;
};

}  // namespace k3::pipeline
