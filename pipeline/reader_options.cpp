#include "pipeline/reader_options.hpp"

#include <algorithm>
#include <cstdlib>

#include "io/aligned.hpp"

namespace k3::pipeline {

int env_int(const char* name) {
  const char* v = std::getenv(name);
  return v && *v ? std::atoi(v) : 0;
}

// Trunk reads keep a short window in flight (4 x 1 MiB), not a whole layer: the device serves
// requests about in order, so an expert read submitted behind 32 x 8 MiB of trunk chunks waited for
// all of them -- 13 ms per MoE layer with the compute idle (16-layer synthetic checkpoint streaming 3
// layers, 1.05 GiB: overlap 0.079 -> 0.055-0.064 s/token). The price, on an idle machine: trunk-only
// reads 2.48-2.65 GB/s at 4 x 1 MiB vs 2.78-2.85 at 32 x 8 MiB (bench's probe, several runs).
io::UringReader::Options trunk_reader_options() {
  io::UringReader::Options o;
  o.queue_depth = 4;
  o.chunk_bytes = size_t{1} << 20;
  if (int qd = env_int("K3FLOW_TRUNK_QD")) o.queue_depth = unsigned(qd);
  if (int kb = env_int("K3FLOW_TRUNK_CHUNK_KB")) o.chunk_bytes = size_t(kb) << 10;
  return o;
}

// Expert reads complete in order, about one expert in flight at a time: with a batch of 8 experts
// all in flight at once they shared the device and landed together at the end, so "compute each
// expert as it lands" computed nothing early (medium synthetic checkpoint at 1 GiB, overlap: 0.069 ->
// 0.060 s/token). Four chunks of a quarter expert each keep the device queue non-empty.
io::UringReader::Options expert_reader_options(uint64_t expert_bytes) {
  io::UringReader::Options o;
  o.queue_depth = 4;
  o.chunk_bytes = std::clamp<size_t>(io::align_up(expert_bytes / 4, io::kDirectAlign), size_t{256} << 10,
                                     size_t{8} << 20);
  if (int qd = env_int("K3FLOW_EXPERT_QD")) o.queue_depth = unsigned(qd);
  if (int kb = env_int("K3FLOW_EXPERT_CHUNK_KB")) o.chunk_bytes = size_t(kb) << 10;
  return o;
}

}  // namespace k3::pipeline
