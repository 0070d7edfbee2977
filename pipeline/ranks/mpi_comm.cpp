#include "pipeline/ranks/mpi_comm.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <chrono>
#include <climits>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "io/env.hpp"

namespace k3::pipeline::ranks {

namespace {

double env_seconds(const io::env::Var& v, double fallback) {
  const auto text = io::env::text(v);
  if (!text) return fallback;
  char* end = nullptr;
  const double s = std::strtod(text->data(), &end);
  return (end && *end == '\0' && s > 0) ? s : fallback;
}

}  // namespace

MpiComm::MpiComm()
    : exchange_timeout_(env_seconds(io::env::kDistTimeout, 300)),
      load_timeout_(env_seconds(io::env::kDistLoadTimeout, 7200)) {
  MPI_Comm_dup(MPI_COMM_WORLD, &comm_);
  MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
  MPI_Comm_rank(comm_, &rank_);
  MPI_Comm_size(comm_, &size_);
  if (const auto f = io::env::text(io::env::kDistFault)) {
    int r = -1;
    char kind[16] = {};
    if (std::sscanf(f->data(), "%d:%15s", &r, kind) == 2) {
      fault_rank_ = r;
      fault_ = kind;
    }
  }
}

MpiComm::~MpiComm() {
  if (comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

void MpiComm::abort(int code, const std::string& message) const {
  std::fflush(stdout);
  std::fprintf(stderr, "k3flow: rank %d of %d: %s\n", rank_, size_, message.c_str());
  std::fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, code);
  std::_Exit(code);  // MPI_Abort does not return; this keeps [[noreturn]] honest if it did
}

void MpiComm::check(int rc, const char* call, const char* what) const {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING] = {};
  int len = 0;
  MPI_Error_string(rc, text, &len);
  abort(1, fmt::format("{} failed during the {}: {}", call, what, std::string(text, size_t(len))));
}

void MpiComm::inject_fault(const char* what) {
  if (fault_rank_ != rank_ || std::strcmp(what, kExpertExchange) != 0) return;
  if (fault_ == "exit") std::raise(SIGKILL);
  if (fault_ == "stall")
    for (;;) pause();  // stops answering; mpirun's abort ends it
}

void MpiComm::allgatherv(std::span<const std::byte> mine, std::span<const size_t> counts,
                         std::span<std::byte> all, const char* what) {
  if (!fault_.empty()) inject_fault(what);
  std::vector<int> n(static_cast<size_t>(size_)), at(static_cast<size_t>(size_));
  size_t total = 0;
  for (int r = 0; r < size_; ++r) {
    if (counts[size_t(r)] > size_t(INT_MAX) || total > size_t(INT_MAX))
      abort(1, fmt::format("the {} moves {} bytes, more than one MPI message holds (2 GiB): feed fewer "
                           "tokens per call",
                           what, total + counts[size_t(r)]));
    n[size_t(r)] = int(counts[size_t(r)]);
    at[size_t(r)] = int(total);
    total += counts[size_t(r)];
  }
  if (mine.size() != counts[size_t(rank_)] || all.size() != total)
    abort(1, fmt::format("the {} posts {} bytes for a count of {} (internal error)", what, mine.size(),
                         counts[size_t(rank_)]));
  MPI_Request req = MPI_REQUEST_NULL;
  check(MPI_Iallgatherv(mine.data(), int(mine.size()), MPI_BYTE, all.data(), n.data(), at.data(), MPI_BYTE,
                        comm_, &req),
        "MPI_Iallgatherv", what);
  // Poll rather than block, so the wait is bounded; sleep between polls once it is clearly not
  // immediate (ranks may share cores: a busy wait would take them from the rank being waited for).
  // Waiting for rank 0's terminal (chat) or its server's next step (serve) has no deadline -- a
  // person may take hours -- and polls every 10 ms: an idle conversation costs the other ranks nothing.
  const bool console = std::strcmp(what, kRank0Console) == 0 || std::strcmp(what, kRank0Server) == 0;
  const double limit = std::strcmp(what, kExpertExchange) == 0 ? exchange_timeout_
                       : console                               ? HUGE_VAL
                                                               : load_timeout_;
  const auto t0 = std::chrono::steady_clock::now();
  for (int polls = 0;; ++polls) {
    int done = 0;
    check(MPI_Test(&req, &done, MPI_STATUS_IGNORE), "MPI_Test", what);
    if (done) return;
    if (polls < 200) continue;
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (waited > limit)
      abort(1, fmt::format("no reply from the other ranks within {:g} s during the {} (a rank died or "
                           "stopped); ending the run (docs/distributed.md §5)",
                           limit, what));
    std::this_thread::sleep_for(std::chrono::microseconds(polls < 2000 ? 2 : console ? 10000 : 50));
  }
}

}  // namespace k3::pipeline::ranks
