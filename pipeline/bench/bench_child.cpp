#include "pipeline/bench/bench_child.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <sstream>

#include "io/error.hpp"

extern char** environ;

namespace k3::pipeline {

namespace fs = std::filesystem;

namespace {

std::string read_or_empty(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

std::string last_line(const std::string& text) {
  std::istringstream in(text);
  std::string line, last;
  while (std::getline(in, line)) {
    while (!line.empty() && (line.back() == '\r' || line.back() == ' ')) line.pop_back();
    if (!line.empty()) last = line;
  }
  return last;
}

}  // namespace

std::string ChildRun::error_line() const {
  const std::string e = last_line(err);
  return e.empty() ? last_line(out) : e;
}

std::string ChildRun::failure() const {
  if (signal != 0) return fmt::format("killed by signal {} ({})", signal, ::strsignal(signal));
  const std::string line = error_line();
  return fmt::format("exit {}: {}", exit_code, line.empty() ? "(no output)" : line);
}

ChildRun run_child(const std::vector<std::string>& argv, const fs::path& scratch_dir) {
  static int serial = 0;
  const int n = ++serial;
  const fs::path out_path = scratch_dir / fmt::format("child{}.out", n);
  const fs::path err_path = scratch_dir / fmt::format("child{}.err", n);

  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&fa, 1, out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_addopen(&fa, 2, err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  std::vector<char*> args;
  args.reserve(argv.size() + 1);
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);

  // The child's ru_maxrss takes in, at its exec, the peak of the address space it was spawned from
  // (Linux keeps it in state that outlives exec): this process's probe buffers came back as every
  // child's "peak RSS" (527 MiB for a 16 MiB run). Resetting our peak to our current RSS (Linux >= 4.0;
  // best effort) leaves only what we hold now in the child's figure.
  std::ofstream("/proc/self/clear_refs") << "5";
  const auto t0 = std::chrono::steady_clock::now();
  pid_t pid = 0;
  const int rc = ::posix_spawn(&pid, args[0], &fa, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) throw io::runtime_error(fmt::format("cannot start {}: {}", argv[0], std::strerror(rc)));

  int status = 0;
  rusage ru{};
  pid_t w;
  do {
    w = ::wait4(pid, &status, 0, &ru);
  } while (w < 0 && errno == EINTR);
  if (w < 0) throw io::runtime_error(fmt::format("wait4 for {}: {}", argv[0], std::strerror(errno)));

  ChildRun r;
  r.wall_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  r.peak_rss_bytes = uint64_t(ru.ru_maxrss) * 1024;  // Linux reports KiB
  if (WIFEXITED(status)) {
    r.exit_code = WEXITSTATUS(status);
  } else if (WIFSIGNALED(status)) {
    r.signal = WTERMSIG(status);
  }
  r.out = read_or_empty(out_path);
  r.err = read_or_empty(err_path);
  std::error_code ec;
  fs::remove(out_path, ec);
  fs::remove(err_path, ec);
  return r;
}

fs::path self_exe() {
  std::error_code ec;
  fs::path p = fs::read_symlink("/proc/self/exe", ec);
  if (ec)
    throw io::runtime_error(fmt::format("cannot find this executable (/proc/self/exe): {}", ec.message()));
  return p;
}

void drop_file_cache(const fs::path& dir) {
  std::error_code ec;
  for (const fs::directory_entry& e : fs::directory_iterator(dir, ec)) {
    if (!e.is_regular_file(ec)) continue;
    const int fd = ::open(e.path().c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
  }
}

ScratchDir::ScratchDir(const std::string& prefix) {
  std::string tmpl = (fs::temp_directory_path() / (prefix + ".XXXXXX")).string();
  if (::mkdtemp(tmpl.data()) == nullptr)
    throw io::runtime_error(
        fmt::format("cannot create a temporary directory {}: {}", tmpl, std::strerror(errno)));
  path_ = tmpl;
}

ScratchDir::~ScratchDir() {
  std::error_code ec;
  fs::remove_all(path_, ec);
}

}  // namespace k3::pipeline
