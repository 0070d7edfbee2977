// Ctrl-C (SIGINT) and SIGTERM for the long-running commands. While an InterruptScope is alive the
// signal only raises a flag that the decode loops poll between tokens: generate stops, writes what
// it promised (marked interrupted) and exits 130 (143 for SIGTERM); chat abandons the current reply
// on Ctrl-C and keeps the session, and ends on SIGTERM. Outside a scope the default action
// (terminate) applies.
#pragma once
#include <atomic>

namespace k3::pipeline {

class InterruptScope {
 public:
  InterruptScope();
  ~InterruptScope();
  InterruptScope(const InterruptScope&) = delete;
  InterruptScope& operator=(const InterruptScope&) = delete;

  static bool requested();  // a signal arrived since the last clear()
  static void clear();
  static int signal_number();  // the last signal caught (SIGINT or SIGTERM), 0 if none
};

// Exit status for a run stopped by a signal (pipeline/support/exit_codes.hpp): 130 for Ctrl-C, 143 for
// SIGTERM.
int interrupted_exit_code();

}  // namespace k3::pipeline
