#include "pipeline/support/exit_codes.hpp"

namespace k3::pipeline {

int exit_code(io::ErrorKind kind) {
  switch (kind) {
    case io::ErrorKind::usage:
      return kExitUsage;
    case io::ErrorKind::runtime:
      return kExitRuntime;
    case io::ErrorKind::run_invalid:
      return kExitInvalidRun;
  }
  return kExitRuntime;
}

int signal_exit_code(int sig) {
  return 128 + sig;
}

}  // namespace k3::pipeline
