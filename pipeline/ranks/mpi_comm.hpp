// The MPI communicator (docs/distributed.md §5), built only when CMake finds MPI. Every collective
// is non-blocking and polled against a deadline, so a rank that stops answering ends the run
// within a bound instead of hanging it: past the deadline this rank prints what it was waiting for
// and calls MPI_Abort, which ends every rank. MPI errors are returned (MPI_ERRORS_RETURN), printed
// naming the call, and abort the run the same way.
//   K3FLOW_DIST_TIMEOUT       seconds an expert exchange may wait (default 300)
//   K3FLOW_DIST_LOAD_TIMEOUT  seconds any other collective may wait: loading, status (default 7200)
//   K3FLOW_DIST_FAULT=R:exit | R:stall   test hook: rank R kills itself (SIGKILL) or stops answering
//                             at its first expert exchange
#pragma once
#include <mpi.h>

#include <string>

#include "pipeline/ranks/comm.hpp"

namespace k3::pipeline::ranks {

class MpiComm final : public Comm {
 public:
  MpiComm();  // a duplicate of MPI_COMM_WORLD; MPI must be initialised
  ~MpiComm() override;
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void allgatherv(std::span<const std::byte> mine, std::span<const size_t> counts, std::span<std::byte> all,
                  const char* what) override;
  // Prints "k3flow: rank R of N: message" and ends every rank's run with `code`.
  [[noreturn]] void abort(int code, const std::string& message) const;

 private:
  void check(int rc, const char* call, const char* what) const;
  void inject_fault(const char* what);
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
  double exchange_timeout_, load_timeout_;
  int fault_rank_ = -1;
  std::string fault_;
};

}  // namespace k3::pipeline::ranks
