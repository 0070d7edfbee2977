// pipeline/bench/device_probe.*: the read pattern matches the checkpoint (every layer's trunk bytes, every
// expert of every MoE layer as its 4096 window inside its shard), and the probe reads what it says
// it read, through O_DIRECT where the filesystem allows it, from shards or from a packed trunk.
#include <doctest/doctest.h>
#include <fmt/format.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <string>

#include "io/config.hpp"
#include "io/error.hpp"
#include "io/packed_trunk.hpp"
#include "io/safetensors.hpp"
#include "pipeline/bench/device_probe.hpp"
#include "tests/temp_dir.hpp"

namespace fs = std::filesystem;
using k3::test::TempDir;
using namespace k3::pipeline;

namespace {

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

namespace {

// Bytes this process had the block layer read for it (/proc/self/io read_bytes): O_DIRECT reads are
// counted there, page-cache hits are not. -1 when the kernel does not expose it.
long long storage_read_bytes() {
  FILE* f = std::fopen("/proc/self/io", "r");
  if (!f) return -1;
  char key[64];
  long long v = -1, out = -1;
  while (std::fscanf(f, "%63s %lld", key, &v) == 2)
    if (std::string(key) == "read_bytes:") out = v;
  std::fclose(f);
  return out;
}

}  // namespace

TEST_CASE("the device ceiling reads what it claims: bytes, the queue depth reached, O_DIRECT") {
  // On the build directory's disk, not a tmpfs: O_DIRECT and the block layer's count need a real one.
  const TempDir tmp(fs::current_path(), "k3ceiling_test.");
  const fs::path model = tmp.path / "tiny", trunk_dir = tmp.path / "trunk";
  k3flow(fmt::format("synth {} --size tiny --seed 2", model.string()));
  k3flow(fmt::format("pack-trunk {} {}", model.string(), trunk_dir.string()));
  const k3::io::ModelConfig cfg = k3::io::load_config(model / "config.json");
  const k3::io::ShardSet shards = k3::io::ShardSet::open(model);
  const k3::io::PackedTrunk trunk = k3::io::PackedTrunk::open(trunk_dir, cfg.n_layers);

  for (const bool packed : {false, true}) {
    CAPTURE(packed);
    const ProbePattern p = probe_pattern(cfg, shards, packed ? &trunk : nullptr);
    REQUIRE(p.files.size() == (packed ? 1u : shards.shard_count()));
    uint64_t file_bytes = 0;
    for (const k3::io::File* f : p.files) file_bytes += f->size() / 4096 * 4096;

    CeilingOptions o;
    o.seconds = 0.3;
    o.queue_depth = 8;
    o.chunk_bytes = size_t{64} << 10;
    const long long before = storage_read_bytes();
    const CeilingResult r = probe_ceiling(p, o);
    const long long after = storage_read_bytes();
    CHECK(r.queue_depth == 8);
    CHECK(r.chunk_bytes == size_t{64} << 10);
    CHECK(r.random_source == "expert windows");
    CHECK(r.sequential.span_bytes == file_bytes);
    CHECK(r.sequential.request_bytes == o.chunk_bytes);
    CHECK(r.random.request_bytes == p.largest_expert_read());
    for (const CeilingPhase* c : {&r.sequential, &r.random}) {
      CHECK(c->requests > 0);
      CHECK(c->bytes > 0);
      CHECK(c->bytes <= c->requests * c->request_bytes);  // no request reads more than its size
      CHECK(c->direct_bytes <= c->bytes);
      CHECK(c->gbps() > 0);
      if (r.backend == "io_uring")
        CHECK(c->peak_in_flight == o.queue_depth);  // the depth it claims was reached, and not exceeded
      else
        MESSAGE("io_uring unavailable (" << r.fallback_reason << "): queue depth not checked");
    }
    if (r.sequential.direct_bytes == r.sequential.bytes && before >= 0 && after >= 0)
      // All O_DIRECT: every byte it counts went to the device (plus what synth/pack did not do here).
      CHECK(uint64_t(after - before) >= r.sequential.bytes + r.random.direct_bytes);
    else
      MESSAGE("O_DIRECT refused here or /proc/self/io absent: storage bytes not checked");
    CHECK(format_ceiling(r).find("8 x 64 KiB in flight") != std::string::npos);
    // The reads land in an area far larger than a CPU cache (one shared buffer flattered a virtual
    // disk 2x), and never smaller than the bytes outstanding.
    CHECK(r.dest_bytes == uint64_t{256} << 20);
    CHECK(format_ceiling(r).find("into 256.00 MiB of memory") != std::string::npos);
  }
  {  // spinners beside a second sequential pass: their share of the CPU, quiet and while reading
    const ProbePattern p = probe_pattern(cfg, shards, &trunk);
    CeilingOptions o;
    o.seconds = 0.1;
    o.queue_depth = 4;
    o.chunk_bytes = size_t{64} << 10;
    const CeilingResult without = probe_ceiling(p, o);
    CHECK_FALSE(without.cpu_reading.measured());  // not asked for: nothing spun, nothing printed
    CHECK(without.read_share_beside() == 0);
    CHECK(format_ceiling(without).find("spinning") == std::string::npos);
    o.cpu_threads = 1;
    o.cpu_seconds = 0.3;
    const CeilingResult r = probe_ceiling(p, o);
    REQUIRE(r.cpu_reading.measured());
    CHECK(r.cpu_reading.threads == 1);
    CHECK(r.cpu_quiet.threads == 1);
    CHECK(r.cpu_quiet.seconds >= 0.15);
    CHECK(r.cpu_reading.seconds >= 0.3);  // the spinners ran as long as the reads beside them
    CHECK(r.beside_spinners.bytes > 0);
    CHECK(r.beside_spinners.requests > 0);
    CHECK(r.read_share_beside() > 0);
    CHECK(r.read_share_beside() <= 1);
    for (const CpuShare* c : {&r.cpu_quiet, &r.cpu_reading}) {
      CHECK(c->share > 0);
      CHECK(c->share <= 1);
    }
    CHECK(format_ceiling(r).find("CPU kept by 1 spinning thread while these reads stream") !=
          std::string::npos);
  }
  {  // an area asked for is used as given, but never smaller than the largest request
    const ProbePattern p = probe_pattern(cfg, shards, &trunk);
    CeilingOptions o;
    o.seconds = 0.05;
    o.queue_depth = 4;
    o.chunk_bytes = size_t{64} << 10;
    o.dest_bytes = uint64_t{3} << 20;
    CHECK(probe_ceiling(p, o).dest_bytes ==
          std::max<uint64_t>(uint64_t{3} << 20, (p.largest_expert_read() + 4095) / 4096 * 4096));
    o.dest_bytes = 4096;
    CHECK(probe_ceiling(p, o).dest_bytes ==
          (std::max<uint64_t>(o.chunk_bytes, p.largest_expert_read()) + 4095) / 4096 * 4096);
  }

  // The pread fallback measures too (no queue depth), and bad options are refused by name.
  const ProbePattern p = probe_pattern(cfg, shards, &trunk);
  CeilingOptions o;
  o.seconds = 0.1;
  o.force_pread = true;
  const CeilingResult r = probe_ceiling(p, o);
  CHECK(r.backend == "pread");
  CHECK(r.sequential.bytes > 0);
  o.queue_depth = 0;
  CHECK_THROWS_WITH_AS(probe_ceiling(p, o), doctest::Contains("queue depth"), k3::io::Error);
  o.queue_depth = 4;
  o.chunk_bytes = 5000;
  CHECK_THROWS_WITH_AS(probe_ceiling(p, o), doctest::Contains("5000"), k3::io::Error);
}
