// The full-scale sparse replica of the released checkpoint (`k3flow synth --sparse`: 497,220
// tensors in 96 shards, headers only, ~130 MB on disk), for the tests that read it. Under ctest it
// is made once per run by the replica_synth fixture test (tests/CMakeLists.txt), which hands its
// path over in K3_REPLICA; a test binary run by hand makes its own in a temporary directory.
// Readers only: no test may change the files.
#pragma once
#include <doctest/doctest.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "tests/temp_dir.hpp"

namespace k3::test {

inline const std::filesystem::path& sparse_replica() {
  namespace fs = std::filesystem;
  static TempDir own("k3_replica_");
  static const fs::path model = [] {
    if (const char* shared = std::getenv("K3_REPLICA"); shared != nullptr && *shared != '\0') {
      REQUIRE_MESSAGE(fs::exists(fs::path(shared) / "config.json"), "K3_REPLICA=", shared,
                      " has no config.json: did the replica_synth fixture test fail?");
      return fs::path(shared);
    }
    const fs::path m = own.path / "k3";
    const std::string cmd = std::string(K3FLOW_BIN) + " synth --sparse " + m.string() + " > /dev/null";
    REQUIRE_MESSAGE(std::system(cmd.c_str()) == 0, cmd);
    return m;
  }();
  return model;
}

}  // namespace k3::test
