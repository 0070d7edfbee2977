// Test helpers for tests that run the k3flow binary (K3FLOW_BIN) as a child: a temp directory
// (tests/temp_dir.hpp), whole files, and a time-bounded run that captures stdout, stderr, the exit code and
// the child's peak RSS: of k3flow with its arguments as plain words (k3flow), or of a shell command line
// (shell, k3flow_sh).
#pragma once
#include <doctest/doctest.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "tests/temp_dir.hpp"

// A sanitized build (K3_SANITIZED, .ci/sanitize): ASan's shadow memory and quarantine make a
// process larger than the allowance `k3flow plan` counts for it, so `generate` plans with its own
// measurement (and says so in a NOTE) and its split differs from plan's. Comparisons of the two, and
// of memory figures, hold only in normal builds; under a sanitizer they are skipped with a message.
namespace k3::test {
#if defined(K3_SANITIZED) || defined(__SANITIZE_ADDRESS__)
inline constexpr bool kSanitized = true;
#else
inline constexpr bool kSanitized = false;
#endif
}  // namespace k3::test
#define K3_CHECK_UNLESS_SANITIZED(expr)                                                          \
  do {                                                                                           \
    if (k3::test::kSanitized)                                                                    \
      MESSAGE("sanitized build: skipped (the process is larger than plan's allowance): " #expr); \
    else                                                                                         \
      CHECK(expr);                                                                               \
  } while (0)

namespace k3::test {

inline std::string slurp(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

inline std::vector<std::string> words(const std::string& s) {
  std::vector<std::string> w;
  size_t i = 0;
  while (i < s.size()) {
    while (i < s.size() && s[i] == ' ') ++i;
    size_t j = i;
    while (j < s.size() && s[j] != ' ') ++j;
    if (j > i) w.push_back(s.substr(i, j - i));
    i = j;
  }
  return w;
}

struct Run {
  int code = -1;
  bool timed_out = false;
  std::string out, err;
  uint64_t peak_rss = 0;  // the child's, as the kernel measured it (wait4 ru_maxrss; see reset_peak_rss)
  int signal = 0;         // the signal that ended the child, if one did (code is then -1)
};

namespace detail {

// Before a fork: this process's peak RSS reset to its current RSS (Linux >= 4.0, best effort). The
// kernel carries the spawning address space's peak into the child's ru_maxrss, so a test that once
// held a large buffer would otherwise see it in every later child's peak_rss.
inline void reset_peak_rss() {
  std::ofstream("/proc/self/clear_refs") << "5";
}

// Waits for `pid` (whose stdout and stderr go to the files `out` and `err`), killing it after
// `timeout_s`; `while_running` as for k3flow below.
inline Run reap(pid_t pid, const std::string& out, const std::string& err, int timeout_s,
                std::function<bool(const std::string&)> while_running) {
  Run r;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
  int status = 0;
  rusage ru{};
  bool hook = bool(while_running);
  for (;;) {
    const pid_t w = ::wait4(pid, &status, WNOHANG, &ru);
    if (w == pid) break;
    if (std::chrono::steady_clock::now() > deadline) {
      ::kill(pid, SIGKILL);
      ::wait4(pid, &status, 0, &ru);
      r.timed_out = true;
      break;
    }
    if (hook) hook = while_running(slurp(out));
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.signal = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
  r.out = slurp(out);
  r.err = slurp(err);
  r.peak_rss = uint64_t(ru.ru_maxrss) * 1024;
  return r;
}

// In a forked child: stdout and stderr to the files `out` and `err`.
inline void redirect(const std::string& out, const std::string& err) {
  const int o = ::open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  const int e = ::open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  ::dup2(o, 1);
  ::dup2(e, 2);
}

}  // namespace detail

// Runs `k3flow <args>` with extra environment `env` (NAME=VALUE words), killing it after
// `timeout_s`. `while_running` is polled every 10 ms with the stdout so far (a test hook may change
// files under the child); it returns false once it has done its work.
inline Run k3flow(const std::string& args, const std::string& env = "", int timeout_s = 60,
                  std::function<bool(const std::string&)> while_running = {}) {
  TempDir io;
  const std::string out = io / "out", err = io / "err";
  std::vector<std::string> argv = words(args);
  argv.insert(argv.begin(), K3FLOW_BIN);
  detail::reset_peak_rss();
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    for (const std::string& kv : words(env)) {
      const size_t eq = kv.find('=');
      ::setenv(kv.substr(0, eq).c_str(), kv.substr(eq + 1).c_str(), 1);
    }
    detail::redirect(out, err);
    std::vector<char*> cargv;
    for (std::string& a : argv) cargv.push_back(a.data());
    cargv.push_back(nullptr);
    ::execv(cargv[0], cargv.data());
    ::_exit(127);
  }
  return detail::reap(pid, out, err, timeout_s, std::move(while_running));
}

// Runs the shell command line `cmd` as `/bin/sh -c CMD` (so quoting, NAME=VALUE prefixes and
// redirections such as 2>&1 work), its stdout and stderr captured apart, killing it after
// `timeout_s` (by default the tests' ctest TIMEOUT). `code` is the shell's exit status: a command
// ended by a signal shows as 128 + the signal unless `cmd` execs it (then code is -1 and `signal`
// names it).
inline Run shell(const std::string& cmd, int timeout_s = 600) {
  TempDir io;
  const std::string out = io / "out", err = io / "err";
  detail::reset_peak_rss();
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    detail::redirect(out, err);
    ::execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  return detail::reap(pid, out, err, timeout_s, {});
}

// Runs `ENV k3flow ARGS` through the shell: `args` are shell words (quotes allowed), `env` shell
// NAME=VALUE assignments for the child.
inline Run k3flow_sh(const std::string& args, const std::string& env = "", int timeout_s = 600) {
  return shell(env + " " + K3FLOW_BIN + " " + args, timeout_s);
}

}  // namespace k3::test
