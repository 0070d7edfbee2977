#include "pipeline/ranks/comm.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <exception>
#include <new>
#include <numeric>
#include <thread>

namespace k3::pipeline::ranks {

namespace {

void check_counts(int rank, std::span<const std::byte> mine, std::span<const size_t> counts,
                  std::span<std::byte> all, const char* what) {
  const size_t total = std::accumulate(counts.begin(), counts.end(), size_t{0});
  if (mine.size() != counts[size_t(rank)] || all.size() != total)
    throw io::runtime_error(fmt::format("{}: rank {} posts {} bytes for a count of {} (internal error)", what,
                                        rank, mine.size(), counts[size_t(rank)]));
}

}  // namespace

void check_all(Comm& comm, const Failure& mine, const char* doing) {
  const int n = comm.size();
  if (n == 1) {
    if (!mine.message.empty()) throw io::Error(mine.kind, mine.message);
    return;
  }
  // Two gathers: every rank's status length (with its kind), then the messages themselves.
  const size_t ranks = static_cast<size_t>(n);
  std::vector<size_t> word(ranks, sizeof(uint64_t));
  const uint64_t my_word = (uint64_t(mine.message.size()) << 2) | uint64_t(mine.kind);
  std::vector<uint64_t> words(ranks);
  comm.allgatherv(std::as_bytes(std::span(&my_word, 1)), word, std::as_writable_bytes(std::span(words)),
                  doing);
  std::vector<size_t> lengths(ranks);
  for (int r = 0; r < n; ++r) lengths[size_t(r)] = size_t(words[size_t(r)] >> 2);
  std::string all(std::accumulate(lengths.begin(), lengths.end(), size_t{0}), '\0');
  comm.allgatherv(std::as_bytes(std::span(mine.message)), lengths, std::as_writable_bytes(std::span(all)),
                  doing);
  size_t at = 0;
  for (int r = 0; r < n; ++r) {
    if (lengths[size_t(r)] > 0)
      throw CollectiveError(
          io::ErrorKind(words[size_t(r)] & 3),
          fmt::format("rank {} of {} {}: {}", r, n, doing, all.substr(at, lengths[size_t(r)])));
    at += lengths[size_t(r)];
  }
}

void on_every_rank(Comm& comm, const char* doing, const std::function<void()>& fn) {
  if (comm.size() == 1) return fn();
  Failure f;
  bool failed = true;
  try {
    fn();
    failed = false;
  } catch (const io::Error& e) {
    f = Failure{.kind = e.kind(), .message = e.what()};
  } catch (const std::bad_alloc&) {
    f = Failure{.kind = io::ErrorKind::runtime, .message = "out of memory"};
  } catch (const std::exception& e) {
    f = Failure{.kind = io::ErrorKind::runtime, .message = e.what()};
  }
  if (failed && f.message.empty()) f.message = "failed (no message)";
  check_all(comm, f, doing);
}

std::string from_rank0(Comm& comm, const std::string& text, const char* what) {
  const size_t n = static_cast<size_t>(comm.size());
  if (n == 1) return text;
  std::vector<size_t> word(n, sizeof(uint64_t));
  const uint64_t mine = text.size();
  std::vector<uint64_t> sizes(n);
  comm.allgatherv(std::as_bytes(std::span(&mine, 1)), word, std::as_writable_bytes(std::span(sizes)), what);
  std::vector<size_t> counts(n, 0);
  counts[0] = size_t(sizes[0]);
  std::string out(counts[0], '\0');
  const std::span<const char> posted = comm.rank() == 0 ? std::span(text) : std::span<const char>();
  comm.allgatherv(std::as_bytes(posted), counts, std::as_writable_bytes(std::span(out)), what);
  return out;
}

char byte_from_rank0(Comm& comm, char mine) {
  const size_t n = static_cast<size_t>(comm.size());
  if (n == 1) return mine;
  const std::vector<size_t> counts(n, 1);
  std::vector<char> all(n);
  comm.allgatherv(std::as_bytes(std::span(&mine, 1)), counts, std::as_writable_bytes(std::span(all)),
                  "a flag from rank 0");
  return all[0];
}

void SingleComm::allgatherv(std::span<const std::byte> mine, std::span<const size_t> counts,
                            std::span<std::byte> all, const char* what) {
  check_counts(0, mine, counts, all, what);
  std::copy(mine.begin(), mine.end(), all.begin());
}

class ThreadGroup::Rank final : public Comm {
 public:
  Rank(ThreadGroup& g, int r) : g_(g), r_(r) {}
  int rank() const override { return r_; }
  int size() const override { return g_.size(); }
  void allgatherv(std::span<const std::byte> mine, std::span<const size_t> counts, std::span<std::byte> all,
                  const char* what) override {
    check_counts(r_, mine, counts, all, what);
    g_.posted_[size_t(r_)] = mine;
    g_.barrier_.arrive_and_wait();  // every rank's bytes are posted
    size_t at = 0;
    for (int r = 0; r < size(); ++r) {
      std::copy(g_.posted_[size_t(r)].begin(), g_.posted_[size_t(r)].end(), all.begin() + ptrdiff_t(at));
      at += counts[size_t(r)];
    }
    g_.barrier_.arrive_and_wait();  // every rank has copied: the posted bytes may change again
  }

 private:
  ThreadGroup& g_;
  int r_;
};

ThreadGroup::ThreadGroup(int n) : barrier_(n), posted_(size_t(n)) {
  for (int r = 0; r < n; ++r) ranks_.push_back(std::make_unique<Rank>(*this, r));
}

ThreadGroup::~ThreadGroup() = default;

void ThreadGroup::run(const std::function<void(Comm&)>& fn) {
  std::vector<std::exception_ptr> errors(ranks_.size());
  std::vector<std::thread> threads;
  for (size_t r = 0; r < ranks_.size(); ++r)
    threads.emplace_back([&, r] {
      try {
        fn(*ranks_[r]);
      } catch (...) {
        errors[r] = std::current_exception();
      }
    });
  for (std::thread& t : threads) t.join();
  for (const std::exception_ptr& e : errors)
    if (e) std::rethrow_exception(e);
}

namespace {
SingleComm single;
Comm* current = &single;
}  // namespace

Comm& world() {
  return *current;
}

void set_world(Comm* c) {
  current = c ? c : &single;
}

}  // namespace k3::pipeline::ranks
