#include "pipeline/progress.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include "pipeline/human_bytes.hpp"

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
  const double frac = total ? static_cast<double>(done) / static_cast<double>(total) : 1.0;
  const int fill = static_cast<int>(frac * kWidth);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  const double rate = secs > 0 ? done / secs : 0;
  std::string eta;
  if (rate > 0 && done < total) eta = fmt::format(" ETA {:.0f}s", (total - done) / rate);
  fmt::print(out_, "\r{} [{}{}] {:3.0f}% {} / {} {}/s{}{}", label_, std::string(fill, '#'),
             std::string(kWidth - fill, '.'), frac * 100, human_bytes(done), human_bytes(total),
             human_bytes(rate), eta, tty_ ? "\x1b[K" : "");
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

}  // namespace k3::pipeline
