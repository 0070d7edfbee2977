#include "io/uring_reader.hpp"

#include <fmt/format.h>
#include <liburing.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "io/aligned.hpp"
#include "io/env.hpp"
#include "io/error.hpp"

namespace k3::io {

namespace {

constexpr size_t kMaxSyscallBytes = size_t{1} << 30;  // docs/engine.md §1.2: cap every read syscall
constexpr uint64_t kWakeTag = 0;                      // user_data of the eventfd poll

struct Job;

// One chunk of a request. Lives in its job's vector, so its address is stable for user_data.
struct Op {
  Job* job;
  int fd;
  bool direct;
  uint64_t off;
  std::byte* dst;
  size_t len;
};

struct Job {
  ReadRequest req;
  UringReader::Callback on_done;
  std::vector<Op> ops;
  size_t next = 0;         // first op not yet handed out
  size_t outstanding = 0;  // handed out (in the kernel or waiting for resubmission), not finished
  int error = 0;
  std::string message;
  bool raised_gate = false;  // counted in the gate until it finishes
  bool queued = true;        // still in the reaper's issue queue; finished only once it has left it

  bool finished() const { return !queued && next == ops.size() && outstanding == 0; }
  void fail(int err, std::string msg) {
    if (error == 0) {
      error = err;
      message = std::move(msg);
    }
    next = ops.size();  // nothing more of this request is read
  }
};

// Splits a request into chunks: the 4096-aligned interior through O_DIRECT when the File has it
// and destination and offset agree modulo 4096, the rest through the buffered descriptor.
void split(Job& job, size_t chunk) {
  const File& f = *job.req.file;
  uint64_t off = job.req.offset;
  std::byte* p = job.req.dst.data();
  size_t n = job.req.dst.size();
  size_t head = n, body = 0;
  if (f.direct() && (off - reinterpret_cast<uintptr_t>(p)) % kDirectAlign == 0) {
    head = std::min(n, size_t((kDirectAlign - off % kDirectAlign) % kDirectAlign));
    body = align_down(n - head, kDirectAlign);
  }
  size_t tail = n - head - body;
  job.ops.reserve((n + chunk - 1) / chunk + 2);
  auto add = [&](size_t len, bool direct) {
    while (len > 0) {
      size_t c = std::min(len, chunk);
      job.ops.push_back(Op{&job, direct ? f.direct_fd() : f.buffered_fd(), direct, off, p, c});
      off += c;
      p += c;
      len -= c;
    }
  };
  add(head, false);
  add(body, true);
  add(tail, false);
}

bool aligned_op(const Op& op) {
  return op.off % kDirectAlign == 0 && reinterpret_cast<uintptr_t>(op.dst) % kDirectAlign == 0 &&
         op.len % kDirectAlign == 0;
}

// Moves an op past `got` delivered bytes; leaves O_DIRECT once the remainder is unaligned.
void advance(Op& op, size_t got) {
  op.off += got;
  op.dst += got;
  op.len -= got;
  if (op.direct && !aligned_op(op)) {
    op.direct = false;
    op.fd = op.job->req.file->buffered_fd();
  }
}

void to_buffered(Op& op) {
  op.direct = false;
  op.fd = op.job->req.file->buffered_fd();
}

std::string read_error(const Op& op, int err) {
  return fmt::format("read failed: {}: {} ({} bytes at offset {})", op.job->req.file->path().string(),
                     std::strerror(err), op.len, op.off);
}

std::string eof_error(const Op& op) {
  struct stat st {};
  long long now = fstat(op.job->req.file->buffered_fd(), &st) == 0 ? (long long)st.st_size : -1;
  return fmt::format(
      "read failed: {}: unexpected end of file ({} bytes wanted at offset {}, file is {} bytes)",
      op.job->req.file->path().string(), op.len, op.off, now);
}

// Queues a job: an urgent one goes before the first non-urgent job, which may be partly issued
// (its remaining chunks then wait); otherwise at the back.
void queue_job(std::deque<Job*>& q, Job* j) {
  if (!j->req.urgent) {
    q.push_back(j);
    return;
  }
  auto it = std::find_if(q.begin(), q.end(), [](const Job* x) { return !x->req.urgent; });
  q.insert(it, j);
}

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

DepthTuner::DepthTuner(Config c) : c_(c) {
  c_.min_depth = std::max(1u, c_.min_depth);
  c_.max_depth = std::max(c_.min_depth, c_.max_depth);
  depth_ = best_depth_ = std::clamp(c_.start_depth, c_.min_depth, c_.max_depth);
}

void DepthTuner::on_epoch(uint64_t bytes, double seconds) {
  if (!(seconds > 0) || bytes == 0) return;
  const double rate = double(bytes) / seconds;
  auto climb_from = [&](unsigned d) {  // a fresh climb: the next epoch is the reference
    settled_ = false;
    best_rate_ = 0;
    depth_ = best_depth_ = std::clamp(d, c_.min_depth, c_.max_depth);
  };
  if (settled_) {
    if (++since_settled_ >= c_.recheck_epochs || rate < 0.5 * best_rate_) climb_from(depth_ / 2);
    return;
  }
  if (best_rate_ == 0 || rate > best_rate_ * c_.gain) {
    best_rate_ = rate;
    best_depth_ = depth_;
    if (depth_ < c_.max_depth) {
      depth_ = std::min(2 * depth_, c_.max_depth);
      return;
    }
  }
  depth_ = best_depth_;  // no gain worth having (or at the cap): the smallest depth that had the rate
  settled_ = true;
  since_settled_ = 0;
}

struct UringReader::Impl {
  Options opt;
  Backend backend = Backend::pread;
  std::string reason;

  std::mutex mu;
  std::condition_variable cv;       // pread thread: work arrived / stop
  std::condition_variable idle_cv;  // wait_idle
  std::deque<Job*> pending;         // submitted, not yet taken by the thread
  bool stopping = false;
  uint64_t submitted = 0, completed = 0;

  std::atomic<uint64_t> n_requests{0}, n_failed{0}, n_uring_chunks{0}, n_uring_bytes{0}, n_pread_bytes{0},
      n_direct_bytes{0}, n_resubmissions{0}, peak_in_flight{0}, n_epochs{0}, n_gated_turns{0}, cur_depth{0};
  std::optional<DepthTuner> tuner;  // adaptive readers only; touched by the reader's thread alone

  io_uring ring{};
  int wake_fd = -1;
  std::thread thread;

  explicit Impl(const Options& o) : opt(o) {
    opt.chunk_bytes = std::clamp(align_up(std::max<size_t>(opt.chunk_bytes, 1), kDirectAlign), kDirectAlign,
                                 kMaxSyscallBytes);
    opt.queue_depth = std::clamp(opt.queue_depth, 1u, 4096u);
    opt.max_depth = std::min(opt.max_depth, 4096u);
    if (opt.max_depth > opt.queue_depth)
      tuner.emplace(DepthTuner::Config{
          .start_depth = opt.queue_depth, .min_depth = opt.queue_depth, .max_depth = opt.max_depth});
    cur_depth = opt.queue_depth;
    const unsigned ring_depth = std::max(opt.queue_depth, opt.max_depth);
    if (opt.force_pread || env::flag(env::kNoUring)) {
      reason = opt.force_pread ? "pread forced by option" : "pread forced by K3FLOW_NO_URING";
    } else if (int e = io_uring_queue_init(ring_depth + 1, &ring, 0); e < 0) {
      reason = fmt::format("io_uring_queue_init failed: {}", std::strerror(-e));
    } else if ((wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) < 0) {
      reason = fmt::format("eventfd failed: {}", std::strerror(errno));
      io_uring_queue_exit(&ring);
    } else {
      backend = Backend::uring;
    }
    if (backend == Backend::uring)
      thread = std::thread([this] { uring_loop(); });
    else
      thread = std::thread([this] { pread_loop(); });
  }

  ~Impl() {
    {
      std::lock_guard lk(mu);
      stopping = true;
    }
    wake();
    thread.join();
    if (backend == Backend::uring) {
      io_uring_queue_exit(&ring);
      close(wake_fd);
    }
  }

  void wake() {
    if (backend == Backend::uring) {
      uint64_t one = 1;
      // Only EAGAIN (counter saturated) can fail here, and then a wake-up is already pending.
      [[maybe_unused]] ssize_t w = write(wake_fd, &one, sizeof one);
    } else {
      cv.notify_one();
    }
  }

  void enqueue(const std::vector<Job*>& jobs) {
    if (opt.raises_gate && opt.gate)
      for (Job* j : jobs)
        if (j->req.urgent) {
          j->raised_gate = true;
          opt.gate->raise();
        }
    {
      std::lock_guard lk(mu);
      for (Job* j : jobs) queue_job(pending, j);
      submitted += jobs.size();
    }
    n_requests += jobs.size();
    wake();
  }

  void finish(Job* job) {
    ReadCompletion c{job->req.tag, job->req.dst, job->error, std::move(job->message)};
    if (!c.ok()) ++n_failed;
    try {
      job->on_done(c);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "k3flow: read completion callback threw: %s\n", e.what());
    } catch (...) {
      std::fprintf(stderr, "k3flow: read completion callback threw\n");
    }
    if (job->raised_gate) opt.gate->lower();  // after the callback: the layer has what it waited for
    delete job;
    {
      std::lock_guard lk(mu);
      ++completed;
    }
    idle_cv.notify_all();
  }

  // ---- io_uring backend: this thread alone prepares, submits and reaps ----

  // What the io_uring thread keeps from one loop turn to the next; no other thread touches it.
  struct UringState {
    std::deque<Job*> issuing;  // jobs with ops not yet handed out, FIFO
    std::deque<Op*> retry;     // ops to resubmit, before any new op
    unsigned inflight = 0;     // read SQEs in the kernel
    bool poll_armed = false;
    bool stop = false;
    // Adaptive depth: time and bytes of the intervals during which the reader was saturated.
    double t_prev = now_seconds(), epoch_seconds = 0;
    uint64_t epoch_bytes = 0;
  };

  // One turn: take new requests, issue reads up to the limit, wait for a completion, reap.
  // Ends once the reader is stopping and nothing is in the kernel or left to issue.
  void uring_loop() {
    UringState s;
    for (;;) {
      take_pending(s);
      if (s.stop) cancel_unread(s);
      arm_wake_poll(s);
      const unsigned depth = tuner ? tuner->depth() : opt.queue_depth;
      const unsigned limit = issue_limit(depth);
      issue_reads(s, limit);
      if (s.stop && s.inflight == 0 && s.issuing.empty() && s.retry.empty()) break;
      // Saturated: the depth, not the work, limits what is in flight (a gated turn says nothing
      // about the depth).
      const bool saturated = tuner && limit == depth && s.inflight >= depth && has_unissued(s);
      submit_and_wait();
      const uint64_t reaped_bytes = reap(s);
      if (tuner) tune_depth(s, saturated, depth, reaped_bytes);
    }
  }

  // Moves the submitted requests into the issue queue (urgent ones ahead) and notes a shutdown.
  void take_pending(UringState& s) {
    std::lock_guard lk(mu);
    for (Job* j : pending) queue_job(s.issuing, j);
    pending.clear();
    s.stop = stopping;
  }

  // Shutdown: every request with chunks not yet in the kernel fails with ECANCELED.
  void cancel_unread(UringState& s) {
    for (Job* j : s.issuing)
      j->fail(ECANCELED, fmt::format("read cancelled: {}: reader shut down", j->req.file->path().string()));
    for (Op* op : s.retry)
      op->job->fail(ECANCELED,
                    fmt::format("read cancelled: {}: reader shut down", op->job->req.file->path().string()));
  }

  // Keeps a poll on the eventfd in the ring, so submit() and shutdown end the wait for completions.
  void arm_wake_poll(UringState& s) {
    if (s.poll_armed) return;
    io_uring_sqe* sqe = io_uring_get_sqe(&ring);
    io_uring_prep_poll_add(sqe, wake_fd, POLLIN);
    io_uring_sqe_set_data64(sqe, kWakeTag);
    s.poll_armed = true;
  }

  // How many reads may be in flight this turn: `depth`, or the gated depth while a shared gate is
  // raised (counted as a gated turn).
  unsigned issue_limit(unsigned depth) {
    if (opt.gated_depth > 0 && opt.gate && opt.gate->raised() && opt.gated_depth < depth) {
      ++n_gated_turns;
      return opt.gated_depth;
    }
    return depth;
  }

  // Prepares a read SQE per op until `limit` are in flight or nothing is left to issue.
  void issue_reads(UringState& s, unsigned limit) {
    while (s.inflight < limit) {
      Op* op = next_op(s);
      if (!op) break;
      io_uring_sqe* sqe = io_uring_get_sqe(&ring);
      io_uring_prep_read(sqe, op->fd, op->dst, unsigned(op->len), op->off);
      io_uring_sqe_set_data(sqe, op);
      ++s.inflight;
    }
    if (s.inflight > peak_in_flight.load(std::memory_order_relaxed))
      peak_in_flight.store(s.inflight, std::memory_order_relaxed);
  }

  // The next op to issue: a retry first (unless its request has failed), then the next chunk of
  // the issue queue. Finishes the requests this leaves with nothing outstanding; nullptr when
  // there is nothing to issue.
  Op* next_op(UringState& s) {
    while (!s.retry.empty()) {
      Op* op = s.retry.front();
      s.retry.pop_front();
      if (op->job->error == 0) return op;
      op_done(op);
    }
    while (!s.issuing.empty()) {
      Job* j = s.issuing.front();
      if (j->next < j->ops.size()) {
        ++j->outstanding;
        ++n_uring_chunks;
        return &j->ops[j->next++];
      }
      s.issuing.pop_front();
      j->queued = false;
      if (j->finished()) finish(j);  // zero-length, or failed with nothing outstanding
    }
    return nullptr;
  }

  // More ops are ready than were issued: a retry, or a chunk not yet handed out.
  static bool has_unissued(const UringState& s) {
    return !s.retry.empty() || s.issuing.size() > 1 ||
           (s.issuing.size() == 1 && s.issuing.front()->next < s.issuing.front()->ops.size());
  }

  // Hands the prepared SQEs to the kernel and waits for at least one completion.
  void submit_and_wait() {
    int r = io_uring_submit_and_wait(&ring, 1);
    if (r < 0 && r != -EINTR && r != -EAGAIN && r != -EBUSY) {
      std::fprintf(stderr, "k3flow: io_uring_submit_and_wait: %s\n", std::strerror(-r));
      io_uring_cqe* cqe = nullptr;
      io_uring_wait_cqe(&ring, &cqe);  // wait for anything at all rather than spin
    }
  }

  // Reaps every completion in the ring: the wake-up poll (re-armed next turn) and reads. Returns
  // the bytes the reads delivered.
  uint64_t reap(UringState& s) {
    uint64_t bytes = 0;
    io_uring_cqe* cqe;
    unsigned head, seen = 0;
    io_uring_for_each_cqe(&ring, head, cqe) {
      ++seen;
      if (cqe->user_data == kWakeTag) {
        uint64_t v;
        [[maybe_unused]] ssize_t rd = read(wake_fd, &v, sizeof v);
        s.poll_armed = false;
        continue;
      }
      --s.inflight;
      bytes += read_done(s, static_cast<Op*>(io_uring_cqe_get_data(cqe)), cqe->res);
    }
    io_uring_cq_advance(&ring, seen);
    return bytes;
  }

  // One read's completion (`res` as the kernel returned it). A short read resubmits the rest;
  // -EINTR, -EAGAIN and an O_DIRECT refusal (-EINVAL) are retried, the last on the buffered
  // descriptor; end of file and any other error fail the request. Returns the bytes delivered.
  uint64_t read_done(UringState& s, Op* op, int res) {
    if (res > 0) {
      n_uring_bytes += uint64_t(res);
      if (op->direct) n_direct_bytes += uint64_t(res);
      if (size_t(res) < op->len) {
        advance(*op, size_t(res));
        ++n_resubmissions;
        s.retry.push_back(op);
      } else {
        op_done(op);
      }
      return uint64_t(res);
    }
    if (res == 0) {
      op->job->fail(ENODATA, eof_error(*op));
      op_done(op);
    } else if (res == -EINTR || res == -EAGAIN) {
      ++n_resubmissions;
      s.retry.push_back(op);
    } else if (res == -EINVAL && op->direct) {
      to_buffered(*op);
      ++n_resubmissions;
      s.retry.push_back(op);
    } else {
      op->job->fail(-res, read_error(*op, -res));
      op_done(op);
    }
    return 0;
  }

  // An op that will not be issued again: its request finishes once nothing else of it is out.
  void op_done(Op* op) {
    --op->job->outstanding;
    if (op->job->finished()) finish(op->job);
  }

  // Adaptive readers: a turn whose wait began `saturated` (the depth was the limit) adds its time
  // and `reaped_bytes` to the epoch; a full epoch goes to the tuner, which may change the depth.
  void tune_depth(UringState& s, bool saturated, unsigned depth, uint64_t reaped_bytes) {
    const double t = now_seconds();
    if (saturated) {
      s.epoch_seconds += t - s.t_prev;
      s.epoch_bytes += reaped_bytes;
    }
    s.t_prev = t;
    if (s.epoch_bytes >= std::max<uint64_t>(opt.epoch_bytes, 8 * uint64_t(depth) * opt.chunk_bytes)) {
      tuner->on_epoch(s.epoch_bytes, s.epoch_seconds);
      ++n_epochs;
      cur_depth = tuner->depth();
      s.epoch_bytes = 0;
      s.epoch_seconds = 0;
    }
  }

  // ---- pread fallback: one thread, requests in order ----

  void pread_loop() {
    for (;;) {
      Job* job;
      {
        std::unique_lock lk(mu);
        cv.wait(lk, [&] { return stopping || !pending.empty(); });
        if (pending.empty()) return;
        job = pending.front();
        pending.pop_front();
      }
      job->queued = false;
      for (Op& op : job->ops) {
        if (stop_requested()) {
          job->fail(ECANCELED,
                    fmt::format("read cancelled: {}: reader shut down", job->req.file->path().string()));
          break;
        }
        if (!pread_op(op)) break;
      }
      finish(job);
    }
  }

  bool stop_requested() {
    std::lock_guard lk(mu);
    return stopping;
  }

  bool pread_op(Op& op) {
    while (op.len > 0) {
      ssize_t r = pread(op.fd, op.dst, std::min(op.len, kMaxSyscallBytes), off_t(op.off));
      if (r > 0) {
        n_pread_bytes += uint64_t(r);
        if (op.direct) n_direct_bytes += uint64_t(r);
        if (size_t(r) < op.len) ++n_resubmissions;
        advance(op, size_t(r));
      } else if (r == 0) {
        op.job->fail(ENODATA, eof_error(op));
        return false;
      } else if (errno == EINTR || errno == EAGAIN) {
        ++n_resubmissions;
      } else if (errno == EINVAL && op.direct) {
        to_buffered(op);
        ++n_resubmissions;
      } else {
        op.job->fail(errno, read_error(op, errno));
        return false;
      }
    }
    return true;
  }
};

UringReader::UringReader() : UringReader(Options{}) {}
UringReader::UringReader(const Options& options) : impl_(std::make_unique<Impl>(options)) {}
UringReader::~UringReader() = default;

void sort_by_position(std::span<ReadRequest> batch) {
  std::stable_sort(batch.begin(), batch.end(), [](const ReadRequest& a, const ReadRequest& z) {
    // std::less orders the File objects (a ShardSet's files lie in shard order); offsets within one.
    if (a.file != z.file) return std::less<const File*>{}(a.file, z.file);
    return a.offset < z.offset;
  });
}

void UringReader::submit(const ReadRequest& request, const Callback& on_done) {
  submit(std::span<const ReadRequest>(&request, 1), on_done);
}

void UringReader::submit(std::span<const ReadRequest> requests, const Callback& on_done) {
  std::vector<Job*> jobs;
  jobs.reserve(requests.size());
  try {
    for (const ReadRequest& r : requests) {
      if (!r.file) throw usage_error("UringReader::submit: request without a file");
      if (!on_done) throw usage_error("UringReader::submit: request without a completion callback");
      auto* j = new Job;
      j->req = r;
      j->on_done = on_done;
      jobs.push_back(j);
      split(*j, impl_->opt.chunk_bytes);
    }
  } catch (...) {
    for (Job* j : jobs) delete j;
    throw;
  }
  impl_->enqueue(jobs);
}

void UringReader::wait_idle() {
  std::unique_lock lk(impl_->mu);
  uint64_t target = impl_->submitted;
  impl_->idle_cv.wait(lk, [&] { return impl_->completed >= target; });
}

UringReader::Backend UringReader::backend() const {
  return impl_->backend;
}
const std::string& UringReader::fallback_reason() const {
  return impl_->reason;
}
const UringReader::Options& UringReader::options() const {
  return impl_->opt;
}

ReaderCounters UringReader::counters() const {
  const Impl& i = *impl_;
  return ReaderCounters{i.n_requests.load(),      i.n_failed.load(),       i.n_uring_chunks.load(),
                        i.n_uring_bytes.load(),   i.n_pread_bytes.load(),  i.n_direct_bytes.load(),
                        i.n_resubmissions.load(), i.peak_in_flight.load(), i.cur_depth.load(),
                        i.n_epochs.load(),        i.n_gated_turns.load()};
}

size_t UringReader::ring_bytes(unsigned queue_depth) {
  size_t entries = 1;
  while (entries < size_t(queue_depth) + 1) entries <<= 1;
  size_t sq = align_up(entries * 64, 4096) + align_up(entries * 4 + 256, 4096);  // SQEs + SQ ring
  size_t cq = align_up(2 * entries * 16 + 256, 4096);                            // CQ ring (2x)
  return sq + cq;
}

const char* backend_name(UringReader::Backend b) {
  return b == UringReader::Backend::uring ? "io_uring" : "pread";
}

}  // namespace k3::io
