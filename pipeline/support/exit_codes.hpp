// k3flow's exit codes, the same for every command (README "Exit codes"), mapped in this one place:
//   0   success
//   1   runtime failure: a file, tensor, read or config.json whose content is wrong (io::ErrorKind::runtime)
//   2   usage: a bad flag or value, a path argument that does not exist or is the wrong kind, a
//       command line CLI11 refuses (io::ErrorKind::usage)
//   4   the run completed but is invalid: its logits went non-finite (io::ErrorKind::run_invalid)
//   130 interrupted by SIGINT (Ctrl-C), 143 by SIGTERM: 128 + the signal, as shells report it
#pragma once
#include "io/error.hpp"

namespace k3::pipeline {

inline constexpr int kExitOk = 0;
inline constexpr int kExitRuntime = 1;
inline constexpr int kExitUsage = 2;
inline constexpr int kExitInvalidRun = 4;

int exit_code(io::ErrorKind kind);
// 128 + sig: 130 for SIGINT, 143 for SIGTERM.
int signal_exit_code(int sig);

}  // namespace k3::pipeline
