// A one-line progress bar on stderr: drawn only when stderr is a terminal or when forced, redrawn
// at most ten times a second, finished with a newline; an ETA while the rate is known. Counts bytes
// (with a rate) or, after set_unit, items such as layers. Safe to update from one thread at a time.
// Nothing goes to stdout: stdout is flushed before the first draw so the two streams stay in order
// on a terminal.
#pragma once
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>
#include <thread>

namespace k3::pipeline {

class Progress {
 public:
  enum class Mode { automatic, always, never };

  Progress(std::string label, Mode mode, std::FILE* out = stderr);
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;
  ~Progress();  // finishes the line if one was drawn

  bool enabled() const { return enabled_; }
  void set_unit(std::string unit) { unit_ = std::move(unit); }  // "layers": counts, not bytes
  void set_note(std::string note) { note_ = std::move(note); }  // drawn after the numbers
  // Reports `done` of `total`; redraws if enough time has passed or the work is complete.
  void update(uint64_t done, uint64_t total);
  void finish();

 private:
  void draw(uint64_t done, uint64_t total);
  std::string label_, unit_, note_;
  std::FILE* out_;
  bool enabled_;
  bool tty_;
  bool drawn_ = false;
  bool finished_ = false;
  std::chrono::steady_clock::time_point start_, last_;
};

// A bar for work that reads files through calls this code does not own (ResidentModel::load): a
// thread of its own samples the bytes this process has read (/proc/self/io rchar) every 100 ms
// against the total given to start(). done() draws the total and ends the line; destroyed without
// done() (the work threw), it stops without claiming completion.
class ReadProgress {
 public:
  ReadProgress(std::string label, Progress::Mode mode);
  ~ReadProgress();
  bool enabled() const { return bar_.enabled(); }
  void start(uint64_t total);
  void done();

 private:
  void stop();
  Progress bar_;
  uint64_t total_ = 0, base_ = 0;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// Bytes this process has read through read(2)/pread(2) and the like (rchar; 0 when unreadable).
uint64_t process_read_bytes();

}  // namespace k3::pipeline
