// What a k3flow subcommand is: a function that declares its flags on the CLI11 subcommand it is
// given and returns the action to run when that subcommand is chosen (pipeline/cli/main.cpp
// registers every one; pipeline/cli/commands.hpp lists them). Errors are thrown as k3::io::Error;
// pipeline/support/exit_codes.* maps them to exit codes in one place.
#pragma once
#include <CLI/CLI.hpp>
#include <functional>

namespace k3::pipeline {

using Action = std::function<int()>;

}  // namespace k3::pipeline
