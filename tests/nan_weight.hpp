// Test helper: a copy of a checkpoint with one tensor poisoned, for the tests of exit 4 (a run whose
// output is not finite). The first 16 bytes of `tensor` become float32 quiet NaNs, which also read
// as NaN in bf16 (each half of a float32 NaN is a bf16 NaN).
#pragma once
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <limits>
#include <string>

#include "io/safetensors.hpp"

namespace k3::test {

inline void copy_with_nan(const std::filesystem::path& from, const std::filesystem::path& to,
                          const std::string& tensor) {
  std::filesystem::remove_all(to);
  std::filesystem::copy(from, to);
  const io::ShardSet shards = io::ShardSet::open(to);
  const auto t = shards.find(tensor);
  REQUIRE_MESSAGE(t, tensor);
  std::fstream f(shards.shard_path(t->shard), std::ios::in | std::ios::out | std::ios::binary);
  REQUIRE(f);
  f.seekp(std::streamoff(t->offset));
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (int i = 0; i < 4; ++i) f.write(reinterpret_cast<const char*>(&nan), sizeof nan);
  REQUIRE(f);
}

}  // namespace k3::test
