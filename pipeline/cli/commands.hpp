// The k3flow subcommands. Each lives in a cmd_<name>.cpp of the folder it belongs to: pipeline/cli/
// for most, pipeline/bench/ for bench and probe, pipeline/serve/ for serve (those two folders
// declare theirs in their own header, so nothing below pipeline/cli/ includes this file).
// pipeline/cli/main.cpp registers them all.
#pragma once
#include "pipeline/bench/bench_commands.hpp"
#include "pipeline/serve/serve_command.hpp"
#include "pipeline/support/command.hpp"

namespace k3::pipeline {

Action add_inspect(CLI::App& sub);
Action add_synth(CLI::App& sub);
Action add_generate(CLI::App& sub);
Action add_plan(CLI::App& sub);
Action add_cache_sim(CLI::App& sub);
Action add_pack_trunk(CLI::App& sub);
Action add_chat(CLI::App& sub);
Action add_tokenize(CLI::App& sub);
Action add_detokenize(CLI::App& sub);

}  // namespace k3::pipeline
