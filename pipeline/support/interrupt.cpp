#include "pipeline/support/interrupt.hpp"

#include <csignal>

#include "pipeline/support/exit_codes.hpp"

namespace k3::pipeline {

namespace {

std::atomic<int> g_signal{0};
struct sigaction g_old_int, g_old_term;

void on_signal(int sig) {
  g_signal.store(sig);
}

}  // namespace

InterruptScope::InterruptScope() {
  g_signal.store(0);
  struct sigaction sa = {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  // No SA_RESTART: a blocking read of the next chat line returns EINTR, so Ctrl-C is seen at once.
  sa.sa_flags = 0;
  sigaction(SIGINT, &sa, &g_old_int);
  sigaction(SIGTERM, &sa, &g_old_term);
}

InterruptScope::~InterruptScope() {
  sigaction(SIGINT, &g_old_int, nullptr);
  sigaction(SIGTERM, &g_old_term, nullptr);
}

bool InterruptScope::requested() {
  return g_signal.load() != 0;
}

void InterruptScope::clear() {
  g_signal.store(0);
}

int InterruptScope::signal_number() {
  return g_signal.load();
}

int interrupted_exit_code() {
  const int s = g_signal.load();
  return signal_exit_code(s ? s : SIGINT);
}

}  // namespace k3::pipeline
