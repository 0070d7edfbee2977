// The two io_uring readers' tuning (queue depth, chunk size), in one place: the streaming graph
// opens its readers with these, and `k3flow bench` probes the device with the same ones, so the
// bandwidth T_io is computed from is the bandwidth the engine's request pattern gets.
// Experiments: K3FLOW_{TRUNK,EXPERT}_{QD,CHUNK_KB} override them (README, environment).
#pragma once
#include <cstdint>

#include "io/uring_reader.hpp"

namespace k3::pipeline {

int env_int(const char* name);  // 0 when unset or empty

io::UringReader::Options trunk_reader_options();
io::UringReader::Options expert_reader_options(uint64_t expert_bytes);

}  // namespace k3::pipeline
