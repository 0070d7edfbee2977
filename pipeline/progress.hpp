// A one-line progress bar on stderr: drawn only when stderr is a terminal or when forced, redrawn
// at most ten times a second, finished with a newline. Safe to update from one thread at a time.
#pragma once
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>

namespace k3::pipeline {

class Progress {
 public:
  enum class Mode { automatic, always, never };

  Progress(std::string label, Mode mode, std::FILE* out = stderr);
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;
  ~Progress();  // finishes the line if one was drawn

  bool enabled() const { return enabled_; }
  // Reports `done` of `total` bytes; redraws if enough time has passed or the work is complete.
  void update(uint64_t done, uint64_t total);
  void finish();

 private:
  void draw(uint64_t done, uint64_t total);
  std::string label_;
  std::FILE* out_;
  bool enabled_;
  bool tty_;
  bool drawn_ = false;
  bool finished_ = false;
  std::chrono::steady_clock::time_point start_, last_;
};

}  // namespace k3::pipeline
