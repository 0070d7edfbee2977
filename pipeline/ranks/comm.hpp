// The collectives expert parallel needs (docs/distributed.md §2), behind one small interface with
// three implementations: one process (every build, `world()` when not under mpirun), threads of one
// process (ThreadGroup: tests run N ranks without MPI) and MPI (mpi_comm.cpp, only when CMake finds
// MPI; Session installs it as `world()`).
#pragma once
#include <barrier>
#include <cstddef>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "io/error.hpp"

namespace k3::pipeline::ranks {

// The `what` of the per-layer gather (MpiComm gives it its own, shorter deadline).
inline constexpr const char* kExpertExchange = "expert exchange";
// The `what` of waiting for what rank 0 reads from its terminal (chat): MpiComm waits without a
// deadline.
inline constexpr const char* kRank0Console = "line from rank 0's terminal";
// The `what` of waiting for rank 0's server to send the next step (serve): a server may be idle
// for hours, so MpiComm waits without a deadline here too.
inline constexpr const char* kRank0Server = "next step from rank 0's server";

class Comm {
 public:
  virtual ~Comm() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Every rank's `mine` concatenated in rank order into `all`. counts[r] is rank r's byte count, the
  // same array on every rank (each rank derives it from data every rank holds); all.size() is their
  // sum. `what` names the operation in a timeout or failure message.
  virtual void allgatherv(std::span<const std::byte> mine, std::span<const size_t> counts,
                          std::span<std::byte> all, const char* what) = 0;
};

// An error every rank raised together, with the same message (a rank's failure, shared by
// check_all): main prints it once, from rank 0, and every rank exits with its code.
class CollectiveError : public io::Error {
 public:
  using io::Error::Error;
};

// Every rank reports its status (`failure` empty: fine; else the kind and message). When any rank
// failed, every rank throws the same CollectiveError: the lowest failing rank's message, as
// "rank R of N <doing>: <message>". Nothing when all succeeded.
struct Failure {
  io::ErrorKind kind = io::ErrorKind::runtime;
  std::string message;  // empty: no failure
};
void check_all(Comm&, const Failure& mine, const char* doing);

// Runs fn on this rank, then check_all: a rank that fails (a missing or unreadable shard of its
// slice) ends the run on every rank with its message instead of leaving the others waiting in the
// first exchange. With one rank fn's exception passes through untouched.
void on_every_rank(Comm&, const char* doing, const std::function<void()>& fn);

// Rank 0's `text` on every rank (what rank 0 read: the prompt; rank 0 owns the console and its
// files, the other ranks pass anything, e.g. ""). With one rank, `text` itself.
std::string from_rank0(Comm&, const std::string& text, const char* what = "prompt from rank 0");
// Rank 0's `mine` on every rank, in one allgather of a byte per rank: what chat's ranks agree on
// before every step (rank 0 alone sees Ctrl-C). With one rank, `mine` itself.
char byte_from_rank0(Comm&, char mine);

class SingleComm final : public Comm {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  void allgatherv(std::span<const std::byte> mine, std::span<const size_t> counts, std::span<std::byte> all,
                  const char* what) override;
};

// N ranks as N threads of one process, sharing memory: the exact split is tested at N = 1..4 in
// one test binary, with or without MPI. Every rank must reach every collective (as with MPI): a rank
// that throws before one leaves the others waiting, so tests keep their inputs valid.
class ThreadGroup {
 public:
  explicit ThreadGroup(int n);
  ~ThreadGroup();
  int size() const { return int(ranks_.size()); }
  // Runs fn(rank's Comm) on n threads and joins them; rethrows the lowest rank's exception.
  void run(const std::function<void(Comm&)>& fn);

 private:
  class Rank;
  friend class Rank;
  std::barrier<> barrier_;
  std::vector<std::span<const std::byte>> posted_;
  std::vector<std::unique_ptr<Rank>> ranks_;
};

// The process's communicator: MPI's world while a Session runs under mpirun, else a SingleComm.
Comm& world();
void set_world(Comm*);  // nullptr: back to the single process

}  // namespace k3::pipeline::ranks
