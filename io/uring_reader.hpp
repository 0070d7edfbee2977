// Asynchronous positioned reads into caller memory (docs/design.md §4, docs/engine.md §3.2 / §3.4).
//
// One reader owns one io_uring and one reaper thread; that thread alone touches the ring (it
// prepares submissions and reaps completions), so submit() from any thread only appends to a queue
// and wakes it through an eventfd the ring polls. Each request is split into chunks (default
// 8 MiB, a multiple of 4096) so one large layer read keeps the device queue deep; up to
// `queue_depth` chunks are in flight, and everything ready is handed to the kernel with one
// io_uring_submit per loop turn. Requests are issued in submission order, except that an urgent
// one (ReadRequest::urgent: a read the compute is waiting for) overtakes non-urgent ones not yet
// issued (a prefetch). Short reads, -EINTR and -EAGAIN are resubmitted at the right
// offset; an O_DIRECT chunk the filesystem refuses (-EINVAL) is retried on the buffered descriptor.
//
// O_DIRECT is used for the 4096-aligned interior of a request when the File has a direct
// descriptor and the destination address and file offset agree modulo 4096; an unaligned head or
// tail goes through the buffered descriptor.
//
// Adaptive depth (Options::max_depth > queue_depth): a slow virtual disk and a fast NVMe need
// different depths, and a depth past the device's knee only makes an urgent read wait behind more
// bytes. The reader starts at queue_depth and, while it is saturated (more chunks ready than it may
// issue), measures the rate per epoch and doubles the depth while that buys more than 5 %
// (DepthTuner below); it settles at the smallest depth that reached the best rate and re-checks
// now and then. A shared UrgentGate lets one reader's urgent reads (an expert the layer waits for)
// hold another's depth (trunk prefetch) at `gated_depth` while they are out, so they do not queue
// behind a deep window in the device.
//
// When io_uring is unavailable (K3FLOW_NO_URING=1, or io_uring_queue_init fails, e.g. under
// seccomp) the same API is served by one thread doing pread(2): the engine runs either way.
//
// Completion contract: every submitted request completes EXACTLY ONCE through its callback, on the
// reader's thread, after the kernel has stopped writing into its destination (also on error and on
// shutdown). A failed read completes with errno + a one-line message naming the file; it never
// hangs. Callbacks must be short and must not throw (the graph calls gateway.try_put() there);
// they must not destroy the reader.
#pragma once
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>

#include "io/file.hpp"

namespace k3::io {

struct ReadRequest {
  const File* file = nullptr;  // must outlive the request
  uint64_t offset = 0;         // byte offset in the file
  std::span<std::byte> dst;    // exactly dst.size() bytes are read; must stay valid until completion
  uint64_t tag = 0;            // echoed in the completion (e.g. layer/expert/slot packed by the caller)
  // Read before every queued non-urgent request: its chunks go to the kernel ahead of theirs (chunks
  // already in the kernel are not recalled). Urgent requests keep their order among themselves.
  bool urgent = false;
};

// Puts a batch of scattered reads (a layer's routed experts) in the order a device serves best: by
// file, then by offset; requests at the same position keep their order. Only the order of the batch
// changes, never what a request reads or where it lands.
void sort_by_position(std::span<ReadRequest> batch);

struct ReadCompletion {
  uint64_t tag = 0;
  std::span<std::byte> dst;  // the request's destination
  int error = 0;             // 0 on success, else an errno value (ECANCELED when the reader shut down)
  std::string message;       // empty on success, else one line naming the file
  bool ok() const { return error == 0; }
};

// Raised while urgent reads of one reader are out; readers that share it may hold their depth.
class UrgentGate {
 public:
  void raise() { n_.fetch_add(1, std::memory_order_acq_rel); }
  void lower() { n_.fetch_sub(1, std::memory_order_acq_rel); }
  bool raised() const { return n_.load(std::memory_order_acquire) > 0; }

 private:
  std::atomic<int> n_{0};
};

// The depth controller of an adaptive reader, apart from the reader so it can be tested against a
// model of a device. It sees epochs during which the reader was saturated (as many chunks in flight
// as depth() allowed, more waiting): `bytes` landed in `seconds`.
//   climbing: the first epoch sets the reference; each later one that beats the best rate by more
//             than `gain` doubles the depth (up to max_depth); one that does not settles at the
//             best depth seen.
//   settled:  after `recheck_epochs` epochs, climbs again from the settled depth (the device, or
//             what shares it, may have changed); a settled epoch far below the best rate (< half)
//             re-measures from the current depth too.
class DepthTuner {
 public:
  struct Config {
    unsigned start_depth = 4, min_depth = 1, max_depth = 64;
    double gain = 1.05;
    unsigned recheck_epochs = 64;
  };
  explicit DepthTuner(Config c);
  unsigned depth() const { return depth_; }
  bool settled() const { return settled_; }
  double best_gbps() const { return best_rate_ / 1e9; }
  void on_epoch(uint64_t bytes, double seconds);

 private:
  Config c_;
  unsigned depth_, best_depth_;
  double best_rate_ = 0;
  bool settled_ = false;
  unsigned since_settled_ = 0;
};

struct ReaderCounters {
  uint64_t requests = 0;        // requests submitted
  uint64_t failed = 0;          // requests completed with an error (cancellations included)
  uint64_t uring_chunks = 0;    // chunks first submitted through io_uring (resubmissions excluded)
  uint64_t uring_bytes = 0;     // bytes delivered by io_uring completions
  uint64_t pread_bytes = 0;     // bytes delivered by pread (fallback backend)
  uint64_t direct_bytes = 0;    // of those, bytes read through the O_DIRECT descriptor
  uint64_t resubmissions = 0;   // short reads, EINTR/EAGAIN, O_DIRECT refusals retried
  uint64_t peak_in_flight = 0;  // most chunks the io_uring backend had in the kernel at once
  uint64_t depth = 0;           // the depth in effect now (adaptive readers change it)
  uint64_t epochs = 0;          // saturated epochs the tuner has seen
  uint64_t gated_turns = 0;     // loop turns that issued less because the urgent gate was raised
};

class UringReader {
 public:
  enum class Backend { uring, pread };
  struct Options {
    size_t chunk_bytes = size_t{8} << 20;  // rounded up to 4096, capped at 1 GiB
    unsigned queue_depth = 32;             // chunks in flight (1..4096); the start when adaptive
    bool force_pread = false;              // also forced by env K3FLOW_NO_URING=1
    // Adaptive when max_depth > queue_depth: the depth moves within [queue_depth, max_depth].
    unsigned max_depth = 0;
    uint64_t epoch_bytes = uint64_t{64} << 20;   // bytes per measured epoch (at least 8 chunks' worth)
    std::shared_ptr<UrgentGate> gate = nullptr;  // shared with the readers it concerns
    bool raises_gate = false;                    // this reader's urgent requests raise `gate`
    unsigned gated_depth = 0;  // > 0: at most this many chunks in flight while `gate` is raised
  };
  using Callback = std::function<void(const ReadCompletion&)>;

  UringReader();
  explicit UringReader(const Options& options);
  // Safe with requests in flight: chunks already in the kernel are waited for (their destination
  // is written until they complete); every request not fully read then completes with ECANCELED.
  // Callbacks run here, on the reader's thread, before the destructor returns.
  ~UringReader();
  UringReader(const UringReader&) = delete;
  UringReader& operator=(const UringReader&) = delete;

  // Queues one read; `on_done` runs once on the reader's thread. Throws usage Error if file is null.
  void submit(const ReadRequest& request, const Callback& on_done);
  // Queues several reads under one wake-up; `on_done` runs once per request (distinguish by tag).
  void submit(std::span<const ReadRequest> requests, const Callback& on_done);

  // Blocks until every request submitted so far has completed (its callback has returned).
  void wait_idle();

  Backend backend() const;
  const std::string& fallback_reason() const;  // why pread was chosen; empty for io_uring
  ReaderCounters counters() const;
  const Options& options() const;

  // Kernel + user memory one reader's ring takes for `queue_depth` (SQ/CQ rings, SQE array), for
  // the memory planner. An upper bound; rounded to pages.
  static size_t ring_bytes(unsigned queue_depth);

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

const char* backend_name(UringReader::Backend b);

}  // namespace k3::io
