// The two io_uring readers' tuning (queue depth, chunk size, adaptation), in one place: the
// streaming graph opens its readers with these, and `k3flow bench` / `k3flow probe` probe the device
// with the same ones beside the device's own ceiling (device_probe.hpp).
// Experiments: K3FLOW_{TRUNK,EXPERT}_{QD,CHUNK_KB}, K3FLOW_TRUNK_MAX_QD (the adaptive cap; equal to
// K3FLOW_TRUNK_QD: a fixed depth) and K3FLOW_TRUNK_GATED_QD (the trunk's depth while an urgent expert
// read is out; 0: no gate) override them (README, environment).
#pragma once
#include <cstdint>
#include <memory>

#include "io/uring_reader.hpp"

namespace k3::pipeline {

io::UringReader::Options trunk_reader_options();
// max_seqs: the most sequences a step carries (MemoryPlan::max_seqs). A step of B rows routes up to
// B x top_k experts a layer, so the window deepens with B (reader_options.cpp).
io::UringReader::Options expert_reader_options(uint64_t expert_bytes, int max_seqs);

// The gate the expert reader's urgent reads raise and the trunk reader yields to (one per process).
std::shared_ptr<io::UrgentGate> urgent_gate();

}  // namespace k3::pipeline
