// Shared by the libFuzzer targets (docs/fuzzing.md). A parser that only takes a path gets the input
// through a file in a per-process scratch directory under $K3_FUZZ_TMPDIR (.ci/fuzz-smoke sets it
// to a directory it removes), else /dev/shm when writable (tmpfs: an exec costs a few syscalls, not
// disk I/O). libFuzzer ends most runs with _Exit, so atexit cleanup would not run.
//
// The contract every target checks: a parser either returns or throws k3::io::Error (the engine's
// one-line refusal). Anything else -- another exception, a crash, a hang, a leak, a sanitizer
// report, or a property a target asserts with K3_FUZZ_CHECK -- is a finding.
#pragma once
#include <fcntl.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <string_view>

#include "io/env.hpp"
#include "io/error.hpp"

namespace k3::fuzz {

namespace fs = std::filesystem;

// A property of an accepted input that does not hold: print it and abort (libFuzzer saves the input).
#define K3_FUZZ_CHECK(cond, what)                                                                          \
  do {                                                                                                     \
    if (!(cond)) {                                                                                         \
      std::fprintf(stderr, "k3 fuzz: %s:%d: property failed: %s (%s)\n", __FILE__, __LINE__, #cond, what); \
      std::abort();                                                                                        \
    }                                                                                                      \
  } while (0)

inline const fs::path& scratch_dir() {
  static const fs::path dir = [] {
    std::error_code ec;
    const auto env = k3::io::env::text(k3::io::env::kFuzzTmpdir);
    fs::path base = env                               ? fs::path(*env)
                    : ::access("/dev/shm", W_OK) == 0 ? fs::path("/dev/shm")
                                                      : fs::temp_directory_path(ec);
    if (ec) base = "/tmp";
    fs::path d = base / ("k3fuzz." + std::to_string(::getpid()));
    fs::create_directories(d);
    return d;
  }();
  return dir;
}

// dir/name with exactly these bytes (created or truncated).
inline fs::path write_file(const fs::path& path, const uint8_t* data, size_t size) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    std::perror(path.c_str());
    std::abort();
  }
  for (size_t done = 0; done < size;) {
    const ssize_t w = ::write(fd, data + done, size - done);
    if (w <= 0) {
      std::perror(path.c_str());
      std::abort();
    }
    done += size_t(w);
  }
  ::close(fd);
  return path;
}
inline fs::path write_file(const fs::path& path, std::string_view text) {
  return write_file(path, reinterpret_cast<const uint8_t*>(text.data()), text.size());
}

// Runs fn; a k3::io::Error is the parser refusing the input, a normal outcome. Returns whether fn
// completed. Any other exception propagates out of LLVMFuzzerTestOneInput and is reported.
template <class Fn>
bool accepts(Fn&& fn) {
  try {
    fn();
    return true;
  } catch (const k3::io::Error&) {
    return false;
  }
}

}  // namespace k3::fuzz
