// `k3flow serve` (cmd_serve.cpp): pipeline/support/command.hpp says what a subcommand function is.
#pragma once
#include "pipeline/support/command.hpp"

namespace k3::pipeline {

Action add_serve(CLI::App& sub);

}  // namespace k3::pipeline
