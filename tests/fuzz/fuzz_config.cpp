// config.json (io/config.*): the bytes go to parse_config, which load_config calls with the file's
// contents. An accepted config must answer every layer-map question the engine asks of it.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "io/config.hpp"
#include "tests/fuzz/fuzz_common.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view json(reinterpret_cast<const char*>(data), size);
  k3::fuzz::accepts([&] {
    const k3::io::ModelConfig c = k3::io::parse_config(json, "fuzz/config.json");
    K3_FUZZ_CHECK(c.n_layers > 0 && c.attn_res_block > 0, "an accepted config has layers and blocks");
    int mla = 0;
    for (int l = 0; l < c.n_layers; ++l) {
      const k3::io::LayerKind k = c.layer(l);
      mla += k.attention == k3::io::LayerAttention::mla;
      K3_FUZZ_CHECK(k.attn_res_boundary == (l % c.attn_res_block == 0), "attn-res boundary");
    }
    K3_FUZZ_CHECK(c.kda_layer_count() >= 0, "kda layers");
    K3_FUZZ_CHECK(c.max_blocks() >= 2, "blocks");
    (void)mla;
    (void)c.summary();
  });
  return 0;
}
