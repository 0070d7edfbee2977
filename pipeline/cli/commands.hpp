// The k3flow subcommands. Each lives in a cmd_<name>.cpp of the folder it belongs to (pipeline/cli/,
// pipeline/bench/ for bench and probe), declares its flags on the subcommand it is given and
// returns the action to run when that subcommand is chosen; pipeline/cli/main.cpp registers them. Errors are
// thrown as k3::io::Error; pipeline/support/exit_codes.* maps them to exit codes in one place.
#pragma once
#include <CLI/CLI.hpp>
#include <cstddef>
#include <functional>

namespace k3::pipeline {

using Action = std::function<int()>;

Action add_inspect(CLI::App& sub);
Action add_synth(CLI::App& sub);
Action add_generate(CLI::App& sub);
Action add_plan(CLI::App& sub);
Action add_cache_sim(CLI::App& sub);
Action add_pack_trunk(CLI::App& sub);
Action add_bench(CLI::App& sub);
Action add_probe(CLI::App& sub);
Action add_chat(CLI::App& sub);
Action add_tokenize(CLI::App& sub);
Action add_detokenize(CLI::App& sub);
Action add_serve(CLI::App& sub);  // pipeline/serve/cmd_serve.cpp

}  // namespace k3::pipeline
