#include "pipeline/ranks/session.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include "io/env.hpp"
#include "pipeline/ranks/comm.hpp"
#ifdef K3_HAVE_MPI
#include "pipeline/ranks/mpi_comm.hpp"
#endif

namespace k3::pipeline::ranks {

struct Session::Impl {
#ifdef K3_HAVE_MPI
  std::unique_ptr<MpiComm> comm;
#endif
};

bool Session::built_with_mpi() {
#ifdef K3_HAVE_MPI
  return true;
#else
  return false;
#endif
}

Session::Session([[maybe_unused]] int& argc, [[maybe_unused]] char**& argv)
    : impl_(std::make_unique<Impl>()) {
  const int launched = io::env::launcher_ranks();
  if (launched == 0) return;
#ifdef K3_HAVE_MPI
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided);
  impl_->comm = std::make_unique<MpiComm>();
  set_world(impl_->comm.get());
  if (rank() != 0) {  // rank 0 owns the console; the others compute the same ids silently
    const int null = ::open("/dev/null", O_WRONLY);
    if (null >= 0) {
      ::dup2(null, STDOUT_FILENO);
      ::close(null);
    }
  }
#else
  if (launched > 1)
    refusal_ = fmt::format(
        "launched as one of {} ranks, but this k3flow was built without MPI (each rank would run the whole "
        "model alone): install libopenmpi-dev and rebuild (docs/distributed.md)",
        launched);
#endif
}

Session::~Session() {
#ifdef K3_HAVE_MPI
  if (impl_->comm) {
    set_world(nullptr);
    impl_->comm.reset();
    MPI_Finalize();
  }
#endif
}

int Session::rank() const {
  return world().rank();
}

int Session::size() const {
  return world().size();
}

std::string Session::error_prefix(bool collective) const {
  return (size() == 1 || collective) ? std::string() : fmt::format("rank {} of {}: ", rank(), size());
}

void Session::after_error([[maybe_unused]] int code, [[maybe_unused]] bool collective) {
#ifdef K3_HAVE_MPI
  if (impl_->comm && size() > 1 && !collective) {
    std::fflush(stdout);
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, code);
  }
#endif
}

}  // namespace k3::pipeline::ranks
