// Child processes for `k3flow bench`: every measured decode is a separate `k3flow generate`, so one
// strategy's allocations, page-cache footprint and thread pools cannot leak into the next one's
// numbers, and its peak RSS comes from the kernel (wait4's rusage), not from the child's own word.
// That figure is the larger of the child's own peak and what this process holds resident when it
// spawns the child (the kernel folds the spawning address space's peak into the child's; run_child
// resets this process's peak to its current RSS first).
#pragma once
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace k3::pipeline {

struct ChildRun {
  int exit_code = -1;           // -1 when the child died of a signal
  int signal = 0;               // the signal, if it did
  uint64_t peak_rss_bytes = 0;  // ru_maxrss from wait4, in bytes (see above)
  double wall_seconds = 0;
  std::string out, err;  // everything it wrote to stdout / stderr
  bool ok() const { return exit_code == 0; }
  // The child's own last word: the last non-empty line of stderr, else of stdout.
  std::string error_line() const;
  // "exit 2: <error line>" or "killed by signal 9 (...)".
  std::string failure() const;
};

// Runs argv (argv[0] = executable path) with stdin from /dev/null and stdout / stderr captured in
// files under `scratch_dir`; waits for it. Throws runtime Error if it cannot be started.
ChildRun run_child(const std::vector<std::string>& argv, const std::filesystem::path& scratch_dir);

// This executable, for re-running k3flow as a child.
std::filesystem::path self_exe();

// Asks the kernel to drop cached pages of every regular file under `dir` (not recursive), so a
// buffered read in one run is not served from the page cache a previous run filled. Best effort.
void drop_file_cache(const std::filesystem::path& dir);

// A temporary directory removed (with its contents) on destruction.
class ScratchDir {
 public:
  explicit ScratchDir(const std::string& prefix);
  ~ScratchDir();
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  const std::filesystem::path& path() const { return path_; }
  std::filesystem::path operator/(const std::string& name) const { return path_ / name; }

 private:
  std::filesystem::path path_;
};

}  // namespace k3::pipeline
