// Test helpers for tests that run the k3flow binary (K3FLOW_BIN) as a child: a temp directory, whole
// files, and a time-bounded run that captures stdout, stderr, the exit code and the child's peak RSS.
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
#include <vector>

namespace k3::test {

struct TempDir {
  std::filesystem::path path;
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "k3_run_XXXXXX").string();
    REQUIRE(::mkdtemp(tmpl.data()) != nullptr);
    path = tmpl;
  }
  ~TempDir() { std::filesystem::remove_all(path); }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string operator/(const std::string& name) const { return (path / name).string(); }
};

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
  uint64_t peak_rss = 0;  // the child's, as the kernel measured it (wait4 ru_maxrss)
};

// Runs `k3flow <args>` with extra environment `env` (NAME=VALUE words), killing it after
// `timeout_s`. `while_running` is polled every 10 ms with the stdout so far (a test hook may change
// files under the child); it returns false once it has done its work.
inline Run k3flow(const std::string& args, const std::string& env = "", int timeout_s = 60,
                  std::function<bool(const std::string&)> while_running = {}) {
  TempDir io;
  const std::string out = io / "out", err = io / "err";
  std::vector<std::string> argv = words(args);
  argv.insert(argv.begin(), K3FLOW_BIN);
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    for (const std::string& kv : words(env)) {
      const size_t eq = kv.find('=');
      ::setenv(kv.substr(0, eq).c_str(), kv.substr(eq + 1).c_str(), 1);
    }
    const int o = ::open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const int e = ::open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(o, 1);
    ::dup2(e, 2);
    std::vector<char*> cargv;
    for (std::string& a : argv) cargv.push_back(a.data());
    cargv.push_back(nullptr);
    ::execv(cargv[0], cargv.data());
    ::_exit(127);
  }
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
  r.out = slurp(out);
  r.err = slurp(err);
  r.peak_rss = uint64_t(ru.ru_maxrss) * 1024;
  return r;
}

}  // namespace k3::test
