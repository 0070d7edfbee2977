// The sampling flags shared by `generate` and `chat` (stages/sampler.hpp holds the sampler).
#pragma once
#include <string>

#include "stages/sampler.hpp"

// Declared, not included: CLI11 is a large header that only the files declaring flags need.
namespace CLI {
class App;
}  // namespace CLI

namespace k3::pipeline {

// --temperature --top-k --top-p --min-p --repeat-penalty --repeat-last-n --presence-penalty
// --frequency-penalty --seed
void add_sampler_flags(CLI::App& sub, stages::SamplerOptions& o);
// One line for the run header: "greedy" or "sampled (temperature 0.7, top-p 0.9, seed 1)".
std::string describe_sampling(const stages::SamplerOptions& o);

}  // namespace k3::pipeline
