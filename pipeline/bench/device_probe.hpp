// The device's read bandwidth, measured the way the engine reads (docs/design.md §5: T_io = bytes read
// ÷ the bandwidth measured by the same tool in the same run). The probe replays one token's reads of
// the model's own files through the engine's reader (io::UringReader, O_DIRECT through the shards'
// or trunk.bin's direct descriptors, the reader's default chunking and queue depth; one reader for
// the trunk and one for experts, as the graph has):
//   per layer, the layer's trunk read(s) (one aligned read of trunk.bin, or the layer's contiguous
//   runs in its shard), then for a MoE layer top_k experts picked pseudo-randomly, each read as its
//   enclosing 4096-byte window (docs/engine.md §3.4) and submitted as one batch sorted by file offset.
// Reads go into a ring of 2 trunk slots and 2 x top_k expert slots, so the next layer's reads are in
// flight while this one's land, as in the `overlap` strategy. Nothing is computed.
//
// Three phases run back to back: the mixed pattern above, trunk reads alone, expert reads alone. Different
// experts are picked every pass, but a small model's files are re-read many times: a device-side cache can
// flatter them; page cache cannot, unless the filesystem refuses O_DIRECT (then `direct_bytes` < `bytes` and
// the report says so).
//
// The engine-settings probe above measures the engine's own request pattern, so a rate derived from
// it cannot show that the engine reads below what the device can do. probe_ceiling() measures the
// device itself, independent of the engine's tuning: a deep queue of large O_DIRECT requests
// (default 32 x 8 MiB in flight) reading the trunk's file(s) front to back, then random expert-sized
// reads (the checkpoint's own expert windows, or 17.5 MiB-class windows when it has no experts).
// T_io and the overlap efficiency are priced with this ceiling (`k3flow bench`, `k3flow probe`).
#pragma once
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "io/config.hpp"
#include "io/file.hpp"
#include "io/uring_reader.hpp"
#include "pipeline/bench/cpu_share.hpp"

namespace k3::io {
class PackedTrunk;
class ShardSet;
}  // namespace k3::io

namespace k3::pipeline {

struct ProbeRange {
  const io::File* file = nullptr;  // owned by the ShardSet / PackedTrunk the pattern came from
  uint64_t offset = 0;             // 4096-aligned unless the file ends first
  uint64_t bytes = 0;
};

// What one token reads, layer by layer.
struct ProbeLayer {
  std::vector<ProbeRange> trunk;    // usually one range
  std::vector<ProbeRange> experts;  // index = expert id; empty for a dense layer
};

struct ProbePattern {
  std::string source;  // "trunk.bin" or "shards"
  std::vector<ProbeLayer> layers;
  std::vector<const io::File*> files;  // what the ceiling reads front to back: trunk.bin, or every shard
  int top_k = 0;
  uint64_t largest_trunk_read() const;
  uint64_t largest_expert_read() const;
  uint64_t token_bytes_estimate() const;  // trunk + top_k x mean expert window, all layers
};

// From the packed trunk when given (trunk.bin layer reads), else from the shard index (each
// layer's dense tensors merged into runs of adjacent bytes). Experts from the shard index. Throws
// runtime Error naming the tensor when an expert cannot be located.
ProbePattern probe_pattern(const io::ModelConfig& config, const io::ShardSet& shards,
                           const io::PackedTrunk* trunk);

struct ProbeOptions {
  double seconds = 1.5;  // whole probe; the mixed phase gets half, each single phase a quarter
  uint64_t seed = 1;     // expert picks
  // The readers' tuning: pass the engine's (reader_options.hpp), so the probe reads as it does.
  io::UringReader::Options trunk_reader{}, expert_reader{};
};

struct PhaseResult {
  uint64_t bytes = 0, direct_bytes = 0, requests = 0;
  double seconds = 0;
  int passes = 0;                 // complete tokens replayed
  std::vector<double> pass_gbps;  // per complete pass
  double gbps() const { return seconds > 0 ? double(bytes) / seconds / 1e9 : 0.0; }
};

struct ProbeResult {
  PhaseResult mixed, trunk, experts;
  std::string backend, fallback_reason;
  unsigned trunk_queue_depth = 0, expert_queue_depth = 0;
  unsigned trunk_max_depth = 0;  // > trunk_queue_depth: the trunk reader adapts up to it
  size_t trunk_chunk_bytes = 0, expert_chunk_bytes = 0;
  double gbps() const { return mixed.gbps(); }  // GB/s (1e9 B), the figure T_io is computed with
};

// Throws runtime Error with the reader's message when a read fails.
ProbeResult probe_device(const ProbePattern& pattern, const ProbeOptions& options);

std::string format_probe(const ProbePattern& pattern, const ProbeResult& r);  // a few lines

// ---- the device's ceiling, independent of the engine's reader settings ----

struct CeilingOptions {
  double seconds = 1.0;                  // whole probe: 60 % sequential, 40 % random
  unsigned queue_depth = 32;             // chunks in flight
  size_t chunk_bytes = size_t{8} << 20;  // one chunk = one request to the kernel
  uint64_t random_bytes = 17547264;      // a real K3 expert; used only when the model has no experts
  uint64_t seed = 1;                     // random offsets / expert picks
  bool force_pread = false;              // tests: the fallback backend
  // Where the reads land: successive requests go to successive places of an area this large (0: the
  // default). Not one shared buffer: a destination that stays in the CPU's caches lets a virtual
  // disk's host copy the bytes far faster than into the engine's ring, which is written front to
  // back every token.
  uint64_t dest_bytes = 0;
  // > 0: after the two phases, that many threads spin (pipeline/bench/cpu_share.hpp) for
  // cpu_seconds / 2 with the device quiet, then for cpu_seconds beside another sequential read
  // with the same depth: the CPU the compute keeps while reads stream.
  int cpu_threads = 0;
  double cpu_seconds = 0.6;
};

struct CeilingPhase {
  uint64_t bytes = 0, direct_bytes = 0, requests = 0;
  uint64_t request_bytes = 0;   // size of one request (sequential: chunk_bytes; random: largest window)
  uint64_t peak_in_flight = 0;  // most chunks the reader had in the kernel at once
  uint64_t span_bytes = 0;      // distinct bytes the phase draws from (file bytes / expert windows)
  double seconds = 0;
  int passes = 0;  // sequential: times the files were read front to back (>= 1 once all read)
  double gbps() const { return seconds > 0 ? double(bytes) / seconds / 1e9 : 0.0; }
};

struct CeilingResult {
  CeilingPhase sequential, random;
  std::string backend, fallback_reason, source;  // source: "trunk.bin" or "shards"
  unsigned queue_depth = 0;
  size_t chunk_bytes = 0;
  std::string random_source;  // "expert windows" or "random windows"
  uint64_t dest_bytes = 0;    // the area the reads landed in (CeilingOptions::dest_bytes)
  // With CeilingOptions::cpu_threads: spinners with the device quiet, and beside `beside_spinners`
  // (the sequential pattern again, its rate shows whether the spinners slowed the reads).
  CpuShare cpu_quiet, cpu_reading;
  CeilingPhase beside_spinners;
  double gbps() const { return sequential.gbps(); }
  // The reads' rate beside the spinners over the sequential ceiling, at most 1 (0: not measured).
  double read_share_beside() const {
    return beside_spinners.bytes && sequential.gbps() > 0
               ? std::min(1.0, beside_spinners.gbps() / sequential.gbps())
               : 0.0;
  }
};

// Reads the pattern's files (trunk.bin, or every shard): sequentially with `queue_depth` x
// `chunk_bytes` in flight, then random expert windows with the same depth. The bytes are discarded,
// so every request in flight lands in one shared destination (the device does the same work; the
// probe's memory stays at one request). Throws runtime Error with the reader's message when a read
// fails, usage Error naming the field for a zero depth or chunk.
CeilingResult probe_ceiling(const ProbePattern& pattern, const CeilingOptions& options);

std::string format_ceiling(const CeilingResult& r);  // a few lines

}  // namespace k3::pipeline
