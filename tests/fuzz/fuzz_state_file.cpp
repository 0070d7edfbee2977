// K3ST saved-state files (pipeline/run/state_file.*): the bytes become a file that peek_state reads and
// load_state restores into the decode state of a small model (fixtures/tiny-k3's config, 13
// layers, 4 of them MLA), as generate --load-state does. An accepted file restores exactly its
// header's positions with ids inside the vocabulary.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "io/config.hpp"
#include "pipeline/run/state_file.hpp"
#include "stages/forward.hpp"
#include "tests/fuzz/fuzz_common.hpp"

namespace fs = k3::fuzz::fs;

namespace {
constexpr size_t kCapacity = 64;  // KV positions: make_seeds writes states of at most this many
const k3::io::ModelConfig& config() {
  static const k3::io::ModelConfig c = k3::io::load_config(fs::path(K3_FIXTURES) / "tiny-k3/config.json");
  return c;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static k3::stages::DecodeState st(config(), config().n_layers, kCapacity);
  static const fs::path path = k3::fuzz::scratch_dir() / "state.k3st";
  k3::fuzz::write_file(path, data, size);
  k3::fuzz::accepts([&] {
    const k3::pipeline::StateHeader h = k3::pipeline::peek_state(path);
    K3_FUZZ_CHECK(h.nseq >= 0 && h.cached >= 0 && h.cached <= h.nseq, "peek_state's header checks");
  });
  std::vector<int32_t> seq;
  st.cached = 0;
  k3::fuzz::accepts([&] {
    k3::pipeline::load_state(path, config(), st, seq);
    K3_FUZZ_CHECK(st.cached <= kCapacity && st.cached <= seq.size(), "restored positions fit");
    for (const int32_t id : seq) K3_FUZZ_CHECK(id >= 0 && id < config().vocab, "ids inside the vocabulary");
  });
  return 0;
}
