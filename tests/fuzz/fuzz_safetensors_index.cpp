// model.safetensors.index.json (io/safetensors.cpp, list_shards and the cross-check): the bytes
// become the index of a directory whose shards are the repository's fixtures (links to
// fixtures/st/* and fixtures/tiny-k3's shard), and ShardSet::open reads it, its shards' headers and
// checks that every tensor it lists is in the shard it names.
#include <cstddef>
#include <cstdint>

#include "io/safetensors.hpp"
#include "tests/fuzz/fuzz_common.hpp"

namespace fs = k3::fuzz::fs;

namespace {
const fs::path& dir() {
  static const fs::path d = [] {
    const fs::path p = k3::fuzz::scratch_dir() / "index";
    fs::create_directories(p);
    const fs::path fx = K3_FIXTURES;
    for (const fs::path& s :
         {fx / "st/model-00001-of-00002.safetensors", fx / "st/model-00002-of-00002.safetensors",
          fx / "tiny-k3/model-00001-of-000001.safetensors"})
      fs::create_symlink(s, p / s.filename());
    return p;
  }();
  return d;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  k3::fuzz::write_file(dir() / "model.safetensors.index.json", data, size);
  k3::fuzz::accepts([&] {
    const k3::io::ShardSet set = k3::io::ShardSet::open(dir());
    K3_FUZZ_CHECK(set.shard_count() >= 1 && set.shard_count() <= 3, "shards from the index");
    size_t listed = 0;
    set.for_each([&](std::string_view name, const k3::io::TensorInfo& t) {
      ++listed;
      const auto found = set.find(name);
      K3_FUZZ_CHECK(found && found->offset == t.offset && found->shard == t.shard, "find() agrees");
    });
    K3_FUZZ_CHECK(listed == set.tensor_count(), "for_each lists tensor_count() tensors");
  });
  return 0;
}
