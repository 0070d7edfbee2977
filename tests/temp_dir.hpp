// The tests' one scratch directory: a new directory (mkdtemp) removed with everything in it at scope
// exit. Under the system temp directory by default; tests that need a real disk (O_DIRECT, the
// block layer's counters) pass the build directory (the tests' working directory) as `parent`.
#pragma once
#include <doctest/doctest.h>
#include <stdlib.h>

#include <filesystem>
#include <string>

namespace k3::test {

struct TempDir {
  std::filesystem::path path;
  explicit TempDir(const std::string& prefix = "k3_test_")
      : TempDir(std::filesystem::temp_directory_path(), prefix) {}
  TempDir(const std::filesystem::path& parent, const std::string& prefix) {
    std::string tmpl = (parent / (prefix + "XXXXXX")).string();
    REQUIRE(::mkdtemp(tmpl.data()) != nullptr);
    path = tmpl;
  }
  ~TempDir() {
    std::error_code ec;  // never throw from a destructor; a leftover directory is harmless
    std::filesystem::remove_all(path, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string operator/(const std::string& name) const { return (path / name).string(); }
};

}  // namespace k3::test
