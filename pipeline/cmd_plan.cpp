// `k3flow plan MODEL_DIR [--trunk DIR] (--mem-gb X | --preset NAME | --trunk-gb X --cache-gb Y)
//  [--context N] [--ring N] [--json]`: how one memory budget splits into pools (pipeline/planner.hpp),
// from the config and the shard headers only, so it sizes the 1.56 TB model from its sparse replica.
#include <fmt/format.h>

#include <cmath>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>

#include "io/config.hpp"
#include "io/error.hpp"
#include "io/packed_trunk.hpp"
#include "io/safetensors.hpp"
#include "pipeline/commands.hpp"
#include "pipeline/planner.hpp"

namespace k3::pipeline {

namespace {

namespace fs = std::filesystem;

struct PlanArgs {
  std::string model_dir, trunk_dir, preset;
  double mem_gb = 0, trunk_gb = 0, cache_gb = 0;
  uint64_t context = 128;
  int ring = 2;
  bool json = false;
};

uint64_t gib_bytes(double gb, const char* flag) {
  if (!(gb > 0) || !std::isfinite(gb) || gb > 1e6)
    throw io::usage_error(fmt::format("{} {} is not a positive size in GiB", flag, gb));
  return uint64_t(std::llround(gb * double(uint64_t{1} << 30)));
}

int run_plan(const PlanArgs& a) {
  const fs::path dir(a.model_dir);
  io::ModelConfig config = io::load_config(dir / "config.json");
  io::ShardSet shards = io::ShardSet::open(dir);
  std::optional<io::PackedTrunk> trunk;
  if (!a.trunk_dir.empty()) trunk.emplace(io::PackedTrunk::open(a.trunk_dir, config.n_layers));
  PlanInputs in = plan_inputs(config, shards, trunk ? &*trunk : nullptr, a.context);

  PlanBudget b;
  b.ring_slots = a.ring;
  if (!a.preset.empty()) {
    b.total = preset_budget(a.preset, in);
    b.source = fmt::format("--preset {}", a.preset);
  } else if (a.mem_gb > 0) {
    b.total = gib_bytes(a.mem_gb, "--mem-gb");
    b.source = fmt::format("--mem-gb {}", a.mem_gb);
  } else if (a.trunk_gb > 0 && a.cache_gb > 0) {
    b.trunk = gib_bytes(a.trunk_gb, "--trunk-gb");
    b.experts = gib_bytes(a.cache_gb, "--cache-gb");
    b.source = fmt::format("--trunk-gb {} --cache-gb {}", a.trunk_gb, a.cache_gb);
  } else {
    throw io::usage_error(
        "plan: give a budget: --mem-gb X, --preset NAME, or --trunk-gb X with --cache-gb Y");
  }
  b.source +=
      fmt::format(", context {}, trunk {}", a.context, trunk ? a.trunk_dir : "planned from the shards");

  Plan plan = make_plan(in, b);
  if (a.json)
    fmt::print("{}\n", plan_json(plan));
  else
    fmt::print("{}", format_plan(plan));
  return 0;
}

}  // namespace

Action add_plan(CLI::App& sub) {
  auto a = std::make_shared<PlanArgs>();
  sub.add_option("MODEL_DIR", a->model_dir, "checkpoint directory (config.json + *.safetensors)")->required();
  sub.add_option("--trunk", a->trunk_dir, "packed trunk directory (trunk.json + trunk.bin) to plan from");
  auto* mem = sub.add_option("--mem-gb", a->mem_gb, "total memory budget in GiB");
  std::string presets;
  for (const std::string& n : preset_names()) presets += (presets.empty() ? "" : ", ") + n;
  auto* preset =
      sub.add_option("--preset", a->preset,
                     "named total budget: laptop 8, desktop 32, workstation 96, server 128, max 224 GiB; "
                     "ultra = the smallest budget that plans (" +
                         presets + ")");
  auto* trunk_gb =
      sub.add_option("--trunk-gb", a->trunk_gb, "GiB for the trunk ring + pinned layers (with --cache-gb)");
  auto* cache_gb =
      sub.add_option("--cache-gb", a->cache_gb, "GiB for expert slots + cache (with --trunk-gb)");
  trunk_gb->needs(cache_gb);
  cache_gb->needs(trunk_gb);
  mem->excludes(preset)->excludes(trunk_gb)->excludes(cache_gb);
  preset->excludes(trunk_gb)->excludes(cache_gb);
  sub.add_option("--context", a->context, "positions the MLA KV cache and scratch are sized for")
      ->capture_default_str()
      ->check(CLI::Range(uint64_t{1}, uint64_t{1} << 24));
  sub.add_option("--ring", a->ring, "trunk ring slots")->capture_default_str()->check(CLI::Range(2, 64));
  sub.add_flag("--json", a->json, "print the plan as one JSON object");
  return [a] { return run_plan(*a); };
}

}  // namespace k3::pipeline
