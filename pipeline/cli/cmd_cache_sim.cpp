// `k3flow cache-sim TRACE [--cache-gb X[,Y...]] [--policy NAME[,...]] [--order incremental|recorded]
//  [--slot-bytes N] [--relabel SEED] [--reverse] [--layers N] [--experts N] [--top-k N] [--json]`:
// replays an expert routing trace (pipeline/graph/routing_trace.hpp: the C reference's
// fixtures/expert_trace.bin, read with --layers/--experts/--top-k, Kimi K3's by default, or what
// `generate --routing-trace` writes, whose header gives them) through the engine's ExpertCache
// under each replacement policy, beside Belady's offline optimum, the compulsory-miss ceiling, the
// bytes read per step and the locality prefetch predictors (pipeline/graph/cache_sim.hpp, docs/routing.md).
#include <fmt/format.h>

#include <memory>
#include <string>
#include <vector>

#include "io/error.hpp"
#include "pipeline/cli/commands.hpp"
#include "pipeline/graph/cache_sim.hpp"
#include "pipeline/support/output_file.hpp"

namespace k3::pipeline {

namespace {

struct CacheSimArgs {
  std::string trace;
  std::vector<double> cache_gib{1, 2, 4, 8, 16, 32};
  std::vector<std::string> policies{"lru", "run"};
  std::string order = "incremental";
  uint64_t slot_bytes = kK3ExpertSlotBytes;
  uint64_t relabel = 0;
  RoutingTraceShape shape;
  bool reverse = false, json = false;
};

int run_cache_sim(const CacheSimArgs& a) {
  check_input_file(a.trace, "TRACE");
  CacheSimOptions o;
  o.cache_gib = a.cache_gib;
  for (const std::string& p : a.policies) o.policies.push_back(parse_expert_policy(p));
  o.order = a.order == "recorded" ? ReplayOrder::recorded : ReplayOrder::incremental;
  o.slot_bytes = a.slot_bytes;
  RoutingTrace t = read_routing_trace(a.trace, a.shape);
  if ((a.relabel || a.reverse) && o.order == ReplayOrder::recorded)
    throw io::usage_error("--relabel and --reverse replay the incremental order, not --order recorded");
  if (a.relabel) t = relabel_experts(t, a.relabel);
  if (a.reverse) t = reverse_positions(t);
  const CacheSimResult r = simulate_cache(t, o);
  fmt::print("{}", a.json ? cache_sim_json(t, o, r) : format_cache_sim(t, o, r, a.trace));
  return 0;
}

}  // namespace

Action add_cache_sim(CLI::App& sub) {
  auto a = std::make_shared<CacheSimArgs>();
  sub.add_option("TRACE", a->trace, "routing trace: little-endian int32 (layer, expert) pairs")->required();
  sub.add_option("--cache-gb", a->cache_gib, "expert cache capacities in GiB, comma-separated")
      ->delimiter(',')
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  sub.add_option("--policy", a->policies, "replacement policies to replay, comma-separated: lru, run")
      ->delimiter(',')
      ->capture_default_str()
      ->check(CLI::IsMember({"lru", "run"}));
  sub.add_option("--order", a->order,
                 "incremental: position by position, layer by layer (a decode); recorded: the file's order")
      ->capture_default_str()
      ->check(CLI::IsMember({"incremental", "recorded"}));
  sub.add_option("--slot-bytes", a->slot_bytes, "bytes of one expert slot (the full-size K3's by default)")
      ->capture_default_str()
      ->check(CLI::Range(uint64_t{1}, uint64_t{1} << 40));
  sub.add_option("--relabel", a->relabel,
                 "relabel each layer's expert ids by a random permutation seeded with N (a robustness check)")
      ->check(CLI::Range(uint64_t{1}, UINT64_MAX));
  sub.add_option("--layers", a->shape.layers,
                 "a trace without the engine's header: its MoE layers are numbered 1..N (Kimi K3: 92)")
      ->capture_default_str()
      ->check(CLI::Range(1, kRoutingHeaderMax));
  sub.add_option("--experts", a->shape.experts,
                 "a trace without the engine's header: its expert ids are 0..N-1 (Kimi K3: 896)")
      ->capture_default_str()
      ->check(CLI::Range(1, kRoutingHeaderMax));
  sub.add_option("--top-k", a->shape.top_k,
                 "a trace without the engine's header: experts per position (Kimi K3: 16)")
      ->capture_default_str()
      ->check(CLI::Range(1, kRoutingHeaderMax));
  sub.add_flag("--reverse", a->reverse, "replay the positions in reverse order (a robustness check)");
  sub.add_flag("--json", a->json, "print the result as one JSON object");
  return [a] { return run_cache_sim(*a); };
}

}  // namespace k3::pipeline
