// pipeline/device_probe.*: the read pattern matches the checkpoint (every layer's trunk bytes, every
// expert of every MoE layer as its 4096 window inside its shard), and the probe reads what it says
// it read, through O_DIRECT where the filesystem allows it, from shards or from a packed trunk.
#include <doctest/doctest.h>
#include <fmt/format.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <optional>
#include <string>

#include "io/config.hpp"
#include "io/packed_trunk.hpp"
#include "io/safetensors.hpp"
#include "pipeline/device_probe.hpp"

namespace fs = std::filesystem;
using namespace k3::pipeline;

namespace {

struct TempDir {
  fs::path path;
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "k3probe_test.XXXXXX").string();
    REQUIRE(::mkdtemp(tmpl.data()) != nullptr);
    path = tmpl;
  }
  ~TempDir() { fs::remove_all(path); }
};

void k3flow(const std::string& args) {
  const std::string cmd = fmt::format("{} {} >/dev/null 2>&1", K3FLOW_BIN, args);
  const int st = std::system(cmd.c_str());
  REQUIRE_MESSAGE((WIFEXITED(st) && WEXITSTATUS(st) == 0), cmd);
}

}  // namespace

TEST_CASE("probe pattern and measurement on a synthetic checkpoint, shards and packed trunk") {
  TempDir d;
  const fs::path model = d.path / "tiny", trunk_dir = d.path / "trunk";
  k3flow(fmt::format("synth {} --size tiny --seed 2", model.string()));
  k3flow(fmt::format("pack-trunk {} {}", model.string(), trunk_dir.string()));
  const k3::io::ModelConfig cfg = k3::io::load_config(model / "config.json");
  const k3::io::ShardSet shards = k3::io::ShardSet::open(model);
  const k3::io::PackedTrunk trunk = k3::io::PackedTrunk::open(trunk_dir, cfg.n_layers);

  for (const bool packed : {false, true}) {
    CAPTURE(packed);
    const ProbePattern p = probe_pattern(cfg, shards, packed ? &trunk : nullptr);
    CHECK(p.source == (packed ? "trunk.bin" : "shards"));
    CHECK(p.top_k == cfg.top_k);
    REQUIRE(p.layers.size() == size_t(cfg.n_layers));
    uint64_t trunk_bytes = 0;
    for (int l = 0; l < cfg.n_layers; ++l) {
      const ProbeLayer& L = p.layers[size_t(l)];
      REQUIRE(!L.trunk.empty());
      for (const ProbeRange& r : L.trunk) {
        CHECK(r.offset % 4096 == 0);
        CHECK(r.bytes > 0);
        CHECK(r.offset + r.bytes <= r.file->size());
        trunk_bytes += r.bytes;
      }
      CHECK(L.experts.size() == (cfg.is_dense(l) ? 0u : size_t(cfg.n_experts)));
      for (const ProbeRange& e : L.experts) {
        CHECK(e.offset % 4096 == 0);
        CHECK(e.offset + e.bytes <= e.file->size());
        CHECK((e.bytes % 4096 == 0 || e.offset + e.bytes == e.file->size()));
      }
    }
    if (packed) {
      uint64_t want = 0;
      for (const k3::io::TrunkLayer& t : trunk.layers()) want += t.nbytes;
      CHECK(trunk_bytes == want);
      CHECK(p.largest_trunk_read() == trunk.largest_layer());
    }

    ProbeOptions o;
    o.seconds = 0.2;
    o.trunk_reader.queue_depth = 3;  // the readers are opened with the options given
    o.trunk_reader.chunk_bytes = size_t{1} << 20;
    o.expert_reader.queue_depth = 2;
    const ProbeResult r = probe_device(p, o);
    CHECK(r.trunk_queue_depth == 3);
    CHECK(r.trunk_chunk_bytes == size_t{1} << 20);
    CHECK(r.expert_queue_depth == 2);
    CHECK(r.mixed.passes >= 1);
    CHECK(r.mixed.bytes >= uint64_t(r.mixed.passes) * p.token_bytes_estimate() / 2);
    CHECK(r.gbps() > 0);
    CHECK(r.trunk.gbps() > 0);
    CHECK(r.experts.gbps() > 0);
    CHECK(r.mixed.direct_bytes <= r.mixed.bytes);
    CHECK(!format_probe(p, r).empty());
  }
}
