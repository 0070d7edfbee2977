// `k3flow bench` (cmd_bench.cpp) and `k3flow probe` (cmd_probe.cpp): pipeline/support/command.hpp
// says what a subcommand function is.
#pragma once
#include "pipeline/support/command.hpp"

namespace k3::pipeline {

Action add_bench(CLI::App& sub);
Action add_probe(CLI::App& sub);

}  // namespace k3::pipeline
