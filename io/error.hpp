// Typed errors raised at the io/ and CLI boundaries, by what went wrong: the caller's request
// (usage: a bad flag, value or path), the data (runtime: a file, tensor or read whose content is
// wrong), or a run that completed with an invalid result (run_invalid: non-finite logits). What a
// program does with each kind (k3flow's exit codes) is the program's policy: pipeline/support/exit_codes.*.
// Kernels never throw.
#pragma once
#include <stdexcept>
#include <string>

namespace k3::io {

enum class ErrorKind { usage, runtime, run_invalid };

// what() is the complete one-line message, already naming the file / tensor / flag it is about.
class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, const std::string& message) : std::runtime_error(message), kind_(kind) {}
  ErrorKind kind() const noexcept { return kind_; }

 private:
  ErrorKind kind_;
};

inline Error usage_error(const std::string& m) {
  return Error(ErrorKind::usage, m);
}
inline Error runtime_error(const std::string& m) {
  return Error(ErrorKind::runtime, m);
}

}  // namespace k3::io
