// One safetensors shard (io/safetensors*.cpp): the bytes become dir/model.safetensors and
// ShardSet::open(dir) reads its header into the compact index (io/safetensors_index.*). An accepted
// shard must list every tensor through for_each and find, and every tensor must be readable.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "io/safetensors.hpp"
#include "tests/fuzz/fuzz_common.hpp"

namespace {
const k3::fuzz::fs::path& dir() {
  static const k3::fuzz::fs::path d = [] {
    const auto p = k3::fuzz::scratch_dir() / "st";
    k3::fuzz::fs::create_directories(p);
    return p;
  }();
  return d;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  k3::fuzz::write_file(dir() / "model.safetensors", data, size);
  k3::fuzz::accepts([&] {
    const k3::io::ShardSet set = k3::io::ShardSet::open(dir());
    K3_FUZZ_CHECK(set.shard_count() == 1, "one shard");
    size_t listed = 0;
    std::string prev;
    set.for_each([&](std::string_view name, const k3::io::TensorInfo& t) {
      K3_FUZZ_CHECK(listed == 0 || prev < name, "for_each in strictly ascending name order");
      prev.assign(name);
      ++listed;
      const auto found = set.find(name);
      K3_FUZZ_CHECK(found.has_value(), "find() returns every listed tensor");
      K3_FUZZ_CHECK(found->offset == t.offset && found->nbytes == t.nbytes && found->rank == t.rank &&
                        found->dtype == t.dtype && found->shape == t.shape,
                    "find() and for_each agree");
      K3_FUZZ_CHECK(t.nbytes == t.numel() * k3::io::dtype_size(t.dtype), "nbytes = numel x dtype size");
      K3_FUZZ_CHECK(t.offset <= set.shard_size(0) && t.nbytes <= set.shard_size(0) - t.offset,
                    "tensor inside its shard");
      if (t.nbytes <= (size_t{1} << 20)) {
        std::vector<std::byte> buf(t.nbytes);
        const bool read = k3::fuzz::accepts([&] { set.read(t, buf); });
        K3_FUZZ_CHECK(read, "an indexed tensor is readable");
      }
    });
    K3_FUZZ_CHECK(listed == set.tensor_count(), "for_each lists tensor_count() tensors");
    (void)set.find("language_model.model.embed_tokens.weight");
    (void)set.index_bytes();
  });
  return 0;
}
