#include "pipeline/support/progress.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>

#include "pipeline/support/human_bytes.hpp"

namespace k3::pipeline {

Progress::Progress(std::string label, Mode mode, std::FILE* out)
    : label_(std::move(label)),
      out_(out),
      tty_(::isatty(::fileno(out)) == 1),
      start_(std::chrono::steady_clock::now()),
      last_(start_) {
  enabled_ = mode == Mode::always || (mode == Mode::automatic && tty_);
}

Progress::~Progress() {
  finish();
}

void Progress::update(uint64_t done, uint64_t total) {
  if (!enabled_ || finished_) return;
  const auto now = std::chrono::steady_clock::now();
  if (drawn_ && done < total && now - last_ < std::chrono::milliseconds(100)) return;
  last_ = now;
  draw(done, total);
}

void Progress::draw(uint64_t done, uint64_t total) {
  constexpr int kWidth = 30;
  const double frac = total ? std::min(1.0, static_cast<double>(done) / static_cast<double>(total)) : 1.0;
  const int fill = static_cast<int>(frac * kWidth);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  const double rate = secs > 0 ? done / secs : 0;
  std::string eta;
  if (rate > 0 && done < total) eta = fmt::format(" ETA {:.0f}s", (total - done) / rate);
  const std::string numbers =
      unit_.empty() ? fmt::format("{} / {} {}", human_bytes(done), human_bytes(total), human_rate(rate))
                    : fmt::format("{} / {} {}", done, total, unit_);
  if (!drawn_) std::fflush(stdout);  // what was printed before the bar stays before it
  fmt::print(out_, "\r{} [{}{}] {:3.0f}% {}{}{}{}", label_, std::string(fill, '#'),
             std::string(kWidth - fill, '.'), frac * 100, numbers, note_, eta, tty_ ? "\x1b[K" : "");
  std::fflush(out_);
  drawn_ = true;
}

void Progress::finish() {
  if (finished_) return;
  finished_ = true;
  if (enabled_ && drawn_) {
    std::fputc('\n', out_);
    std::fflush(out_);
  }
}

uint64_t process_read_bytes() {
  std::ifstream f("/proc/self/io");
  std::string key;
  uint64_t value = 0;
  while (f >> key >> value)
    if (key == "rchar:") return value;
  return 0;
}

ReadProgress::ReadProgress(std::string label, Progress::Mode mode) : bar_(std::move(label), mode) {}

ReadProgress::~ReadProgress() {
  stop();
}

void ReadProgress::start(uint64_t total) {
  if (!bar_.enabled() || thread_.joinable()) return;
  total_ = total;
  base_ = process_read_bytes();
  bar_.update(0, total_);
  thread_ = std::thread([this] {
    while (!stop_.load()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      const uint64_t now = process_read_bytes();
      // The total is drawn by done(): a sample never claims it.
      if (!stop_.load())
        bar_.update(std::min(now > base_ ? now - base_ : 0, total_ ? total_ - 1 : 0), total_);
    }
  });
}

void ReadProgress::stop() {
  stop_.store(true);
  if (thread_.joinable()) thread_.join();
}

void ReadProgress::done() {
  const bool started = thread_.joinable();
  stop();
  if (started) bar_.update(total_, total_);
  bar_.finish();
}

}  // namespace k3::pipeline
