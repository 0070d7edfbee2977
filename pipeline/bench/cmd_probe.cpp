// `k3flow probe MODEL_DIR [--trunk DIR] [--seconds S] [--queue-depth N] [--chunk-kb K] [--json]`: the
// device's read ceiling beside the rate the engine's own reader settings get (pipeline/bench/device_probe.*).
//   ceiling: a deep queue of large O_DIRECT requests (32 x 8 MiB unless told otherwise) over the
//            packed trunk file (or every shard) front to back, then random expert-sized reads;
//   engine:  one token's reads replayed with the engine's reader settings (reader_options.*).
//   CPU:     spinner threads (--cpu-threads, default one per hardware thread) with the device quiet,
//            then beside the ceiling's sequential reads: the share of their time they keep
//            (cpu_share.hpp); on a VM the host's side of the I/O can take it from the vCPUs.
// The last line is `ceiling_gbps=X random_gbps=Y engine_gbps=Z engine_vs_ceiling=R
// cpu_share_reading=C`; with --json the whole result is one JSON object on stdout instead of the text.
#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "io/config.hpp"
#include "io/error.hpp"
#include "io/json_text.hpp"
#include "io/packed_trunk.hpp"
#include "io/safetensors.hpp"
#include "pipeline/bench/bench_commands.hpp"
#include "pipeline/bench/device_probe.hpp"
#include "pipeline/graph/reader_options.hpp"

namespace k3::pipeline {

namespace {

namespace fs = std::filesystem;

struct ProbeArgs {
  std::string model_dir, trunk_dir;
  double seconds = 3.0;
  unsigned queue_depth = 32;
  unsigned chunk_kb = 8192;
  unsigned dest_mb = 0;  // 0: probe_ceiling's default
  int cpu_threads = -1;  // -1: the machine's hardware threads; 0: not measured
  bool json = false;
};

void phase_json(io::JsonWriter& w, const CeilingPhase& c) {
  w.begin_object()
      .field("gbps", c.gbps())
      .field("bytes", c.bytes)
      .field("direct_bytes", c.direct_bytes)
      .field("requests", c.requests)
      .field("request_bytes", c.request_bytes)
      .field("peak_in_flight", c.peak_in_flight)
      .field("span_bytes", c.span_bytes)
      .field("seconds", c.seconds)
      .field("passes", c.passes)
      .end_object();
}

void engine_json(io::JsonWriter& w, const PhaseResult& p) {
  w.begin_object()
      .field("gbps", p.gbps())
      .field("bytes", p.bytes)
      .field("direct_bytes", p.direct_bytes)
      .field("requests", p.requests)
      .field("seconds", p.seconds)
      .end_object();
}

int run_probe(const ProbeArgs& a) {
  const fs::path dir(a.model_dir);
  if (!fs::exists(dir / "config.json"))
    throw io::usage_error(fmt::format("MODEL_DIR: no config.json in {}", a.model_dir));
  if (!a.trunk_dir.empty() && !fs::is_directory(a.trunk_dir))
    throw io::usage_error(fmt::format("--trunk: {} is not a directory", a.trunk_dir));
  if (a.chunk_kb % 4 != 0)
    throw io::usage_error(
        fmt::format("--chunk-kb {} is not a multiple of 4 (O_DIRECT reads whole 4 KiB pages)", a.chunk_kb));
  const io::ModelConfig config = io::load_config(dir / "config.json");
  const io::ShardSet shards = io::ShardSet::open(dir);
  std::optional<io::PackedTrunk> trunk;
  if (!a.trunk_dir.empty()) trunk.emplace(io::PackedTrunk::open(a.trunk_dir, config.n_layers));
  const ProbePattern pattern = probe_pattern(config, shards, trunk ? &*trunk : nullptr);

  CeilingOptions co;
  co.seconds = a.seconds * 2 / 3;
  co.queue_depth = a.queue_depth;
  co.chunk_bytes = size_t(a.chunk_kb) << 10;
  co.dest_bytes = uint64_t(a.dest_mb) << 20;
  co.cpu_threads =
      a.cpu_threads >= 0 ? a.cpu_threads : int(std::max(1u, std::thread::hardware_concurrency()));
  const CeilingResult ceiling = probe_ceiling(pattern, co);

  ProbeOptions po;
  po.seconds = a.seconds / 3;
  po.trunk_reader = trunk_reader_options();
  po.expert_reader = expert_reader_options(pattern.largest_expert_read(), 1);
  const ProbeResult engine = probe_device(pattern, po);
  const double ratio = ceiling.gbps() > 0 ? engine.gbps() / ceiling.gbps() : 0.0;
  const double trunk_ratio = ceiling.gbps() > 0 ? engine.trunk.gbps() / ceiling.gbps() : 0.0;

  if (a.json) {
    io::JsonWriter w;
    w.begin_object()
        .field("model", a.model_dir)
        .field("source", pattern.source)
        .field("backend", ceiling.backend)
        .key("ceiling")
        .begin_object()
        .field("queue_depth", ceiling.queue_depth)
        .field("chunk_bytes", ceiling.chunk_bytes)
        .key("sequential");
    phase_json(w, ceiling.sequential);
    w.key("random");
    phase_json(w, ceiling.random);
    w.field("random_source", ceiling.random_source)
        .end_object()
        .key("cpu")
        .begin_object()
        .field("threads", ceiling.cpu_reading.threads)
        .field("share_reading", ceiling.cpu_reading.share)
        .field("share_quiet", ceiling.cpu_quiet.share)
        .field("longest_gap_reading_s", ceiling.cpu_reading.longest_gap)
        .field("longest_gap_quiet_s", ceiling.cpu_quiet.longest_gap)
        .field("reading_gbps", ceiling.beside_spinners.gbps())
        .field("read_share", ceiling.read_share_beside())
        .end_object()
        .key("engine")
        .begin_object()
        .field("trunk_queue_depth", engine.trunk_queue_depth)
        .field("trunk_chunk_bytes", engine.trunk_chunk_bytes)
        .field("expert_queue_depth", engine.expert_queue_depth)
        .field("expert_chunk_bytes", engine.expert_chunk_bytes)
        .key("token_pattern");
    engine_json(w, engine.mixed);
    w.key("trunk");
    engine_json(w, engine.trunk);
    w.key("experts");
    engine_json(w, engine.experts);
    w.end_object()
        .field("ceiling_gbps", ceiling.gbps())
        .field("random_gbps", ceiling.random.gbps())
        .field("engine_gbps", engine.gbps())
        .field("engine_vs_ceiling", ratio)
        .field("engine_trunk_vs_ceiling", trunk_ratio)
        .end_object();
    std::printf("%s\n", w.str().c_str());
    return 0;
  }
  std::printf("%s", format_ceiling(ceiling).c_str());
  std::printf("%s", format_probe(pattern, engine).c_str());
  std::printf("engine settings / ceiling: token pattern %.3f, trunk reads %.3f\n", ratio, trunk_ratio);
  std::printf("ceiling_gbps=%.3f random_gbps=%.3f engine_gbps=%.3f engine_vs_ceiling=%.3f", ceiling.gbps(),
              ceiling.random.gbps(), engine.gbps(), ratio);
  if (ceiling.cpu_reading.measured()) std::printf(" cpu_share_reading=%.3f", ceiling.cpu_reading.share);
  std::printf("\n");
  return 0;
}

}  // namespace

Action add_probe(CLI::App& sub) {
  auto a = std::make_shared<ProbeArgs>();
  sub.add_option("MODEL_DIR", a->model_dir, "checkpoint directory (config.json + *.safetensors)")->required();
  sub.add_option("--trunk", a->trunk_dir,
                 "packed trunk directory (trunk.json + trunk.bin): read it, not the shards");
  sub.add_option("--seconds", a->seconds,
                 "time spent reading (2/3 for the ceiling, 1/3 with the engine's settings)")
      ->check(CLI::Range(0.05, 600.0))
      ->capture_default_str();
  sub.add_option("--queue-depth", a->queue_depth, "ceiling: chunks in flight")
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  sub.add_option("--chunk-kb", a->chunk_kb, "ceiling: chunk (request) size in KiB, a multiple of 4")
      ->check(CLI::Range(4, 1 << 20))
      ->capture_default_str();
  sub.add_option("--dest-mb", a->dest_mb,
                 "ceiling: MiB of memory the reads land in, front to back (default: 256 MiB or the window in "
                 "flight, whichever is larger)")
      ->check(CLI::Range(1, 1 << 20));
  sub.add_option("--cpu-threads", a->cpu_threads,
                 "spinner threads measuring the CPU compute keeps while reads stream, and with the device "
                 "quiet (default: the machine's hardware threads; 0: skip)")
      ->check(CLI::Range(0, 1024));
  sub.add_flag("--json", a->json, "print the result as one JSON object instead of text");
  return [a] { return run_probe(*a); };
}

}  // namespace k3::pipeline
