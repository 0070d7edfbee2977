// The process's place in a run over several ranks (docs/distributed.md): constructed first in main.
// Launched by mpirun (Open MPI's OMPI_COMM_WORLD_SIZE, or PMI_SIZE / PMIX_RANK) with MPI built in,
// it initialises MPI, installs MPI's world as ranks::world(), silences stdout on every rank but 0
// (rank 0 owns the console; every rank computes the same ids), and finalizes at exit. Otherwise it
// does nothing, except refuse a launch of N > 1 ranks by a build without MPI (N independent copies
// would each run the whole model).
#pragma once
#include <memory>
#include <string>

namespace k3::pipeline::ranks {

class Session {
 public:
  Session(int& argc, char**& argv);
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  int rank() const;
  int size() const;
  // Non-empty: the process must not run (a usage refusal for main to print, exit 2).
  const std::string& refusal() const { return refusal_; }

  // main's error path. A collective error (every rank raised it together) is printed by rank 0
  // alone and every rank exits normally with its code; any other error on one of several ranks is
  // printed with "rank R of N: " first, then the whole run is aborted (the other ranks may be waiting
  // in an exchange for this one).
  bool prints_error(bool collective) const { return size() == 1 || !collective || rank() == 0; }
  std::string error_prefix(bool collective) const;
  void after_error(int code, bool collective);

  static bool built_with_mpi();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::string refusal_;
};

}  // namespace k3::pipeline::ranks
