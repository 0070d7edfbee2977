// Typed errors raised at the io/ and CLI boundaries. The CLI maps each kind to an exit code in one
// place (pipeline/exit_codes.*): usage -> 2, runtime -> 1, run_invalid -> 4. Kernels never throw.
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

inline Error usage_error(const std::string& m) { return Error(ErrorKind::usage, m); }
inline Error runtime_error(const std::string& m) { return Error(ErrorKind::runtime, m); }

}  // namespace k3::io
