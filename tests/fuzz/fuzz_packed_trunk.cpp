// trunk.json (io/packed_trunk.*): the bytes become dir/trunk.json next to a fixed 64 KiB trunk.bin
// of zeros, and PackedTrunk::open(dir, any layer count) validates it. An accepted description must
// keep every layer inside trunk.bin and every tensor inside its layer; the checksum paths
// (check_loaded, verify_layer) run on the accepted layers.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "io/packed_trunk.hpp"
#include "tests/fuzz/fuzz_common.hpp"

namespace fs = k3::fuzz::fs;

namespace {
constexpr size_t kBinBytes = 16 * k3::io::kTrunkAlign;
const fs::path& dir() {
  static const fs::path d = [] {
    const fs::path p = k3::fuzz::scratch_dir() / "trunk";
    fs::create_directories(p);
    const std::vector<uint8_t> zeros(kBinBytes);
    k3::fuzz::write_file(p / "trunk.bin", zeros.data(), zeros.size());
    return p;
  }();
  return d;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  k3::fuzz::write_file(dir() / "trunk.json", data, size);
  k3::fuzz::accepts([&] {
    const k3::io::PackedTrunk t = k3::io::PackedTrunk::open(dir(), -1, k3::io::File::Mode::buffered);
    K3_FUZZ_CHECK(t.file().size() == kBinBytes, "trunk.bin");
    // A compressed trunk's nbytes is the decoded size; what lies in trunk.bin is stored_bytes.
    const bool raw = t.codec() == k3::io::codec::Codec::none;
    K3_FUZZ_CHECK(!raw || t.largest_layer() <= kBinBytes, "largest layer inside trunk.bin");
    (void)t.index_bytes();
    const std::vector<std::byte> zeros(kBinBytes);
    for (size_t l = 0; l < t.layers().size(); ++l) {
      const k3::io::TrunkLayer& L = t.layer(int(l));
      K3_FUZZ_CHECK(L.file_off % k3::io::kTrunkAlign == 0 && L.stored_bytes % k3::io::kTrunkAlign == 0,
                    "aligned layer");
      K3_FUZZ_CHECK(L.file_off <= kBinBytes && L.stored_bytes <= kBinBytes - L.file_off,
                    "layer inside trunk.bin");
      for (const k3::io::TrunkTensor& tt : L.tensors) {
        K3_FUZZ_CHECK(tt.off <= L.nbytes && tt.nbytes <= L.nbytes - tt.off, "tensor inside its layer");
        K3_FUZZ_CHECK(L.find(tt.name) != nullptr, "find() returns every tensor");
      }
      if (raw) k3::fuzz::accepts([&] { t.check_loaded(int(l), std::span(zeros).first(L.nbytes)); });
      if (l < 2) k3::fuzz::accepts([&] { t.verify_layer(int(l)); });
    }
  });
  return 0;
}
