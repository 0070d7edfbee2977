// What flows from the scheduler thread to one request's connection: text deltas as they are
// decoded, then one outcome. The scheduler never waits on a client: push() only appends to a
// bounded buffer and reports false when the client has fallen that far behind (the scheduler then
// cancels the sequence); the connection drains the buffer at its own pace. A connection that sees
// its client go sets cancel(), and the scheduler frees the sequence's slot at the next step.
#pragma once
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace k3::pipeline::serve {

enum class Finish { stop, length, cancelled, error };

const char* finish_name(Finish);  // "stop", "length", "cancelled", "error"

// One generated token's log-probability and its most likely alternatives (bytes, logprob).
struct TokenLogprobs {
  std::string bytes;
  double logprob = 0;
  std::vector<std::pair<std::string, double>> top;
};

// A chat reply's function call, complete: its name and arguments (a JSON object as text).
struct CallDelta {
  std::string name, arguments;
};

struct Delta {
  std::string text;       // visible text (chat: the reply channel)
  std::string reasoning;  // chat with thinking: the think channel
  std::vector<int32_t> ids;
  std::vector<TokenLogprobs> logprobs;  // one per id when the request asked for logprobs
  std::vector<CallDelta> tool_calls;    // chat: calls completed by this delta's ids
};

struct Outcome {
  Finish finish = Finish::stop;
  std::string error;  // Finish::error: what went wrong
  int prompt_tokens = 0, completion_tokens = 0;
  int cached_tokens = 0;  // prompt tokens restored from the prompt cache instead of prefilled
};

class Channel {
 public:
  explicit Channel(size_t max_buffered_bytes = 1 << 20) : max_bytes_(max_buffered_bytes) {}

  // Scheduler side. push: false when the buffer is over its bound (the client is too slow).
  bool push(Delta d) {
    std::lock_guard lock(m_);
    buffered_ += d.text.size() + d.reasoning.size() + 4 * d.ids.size();
    deltas_.push_back(std::move(d));
    cv_.notify_all();
    return buffered_ <= max_bytes_;
  }
  void finish(Outcome o) {
    std::lock_guard lock(m_);
    outcome_ = std::move(o);
    cv_.notify_all();
  }

  // Connection side. next(): the next delta, or nullopt once the outcome is set and every delta has
  // been taken, or when `wait` passes with nothing new (check done() to tell them apart).
  std::optional<Delta> next(std::chrono::milliseconds wait) {
    std::unique_lock lock(m_);
    cv_.wait_for(lock, wait, [&] { return !deltas_.empty() || outcome_.has_value(); });
    if (deltas_.empty()) return std::nullopt;
    Delta d = std::move(deltas_.front());
    deltas_.pop_front();
    buffered_ -= d.text.size() + d.reasoning.size() + 4 * d.ids.size();
    return d;
  }
  bool done() const {
    std::lock_guard lock(m_);
    return outcome_.has_value() && deltas_.empty();
  }
  std::optional<Outcome> outcome() const {
    std::lock_guard lock(m_);
    return outcome_;
  }
  void cancel() { cancelled_ = true; }
  bool cancelled() const { return cancelled_; }

 private:
  mutable std::mutex m_;
  std::condition_variable cv_;
  std::deque<Delta> deltas_;
  size_t buffered_ = 0, max_bytes_;
  std::optional<Outcome> outcome_;
  std::atomic<bool> cancelled_{false};
};

}  // namespace k3::pipeline::serve
