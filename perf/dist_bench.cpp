// dist_bench: the cost of expert parallel's communication (docs/distributed.md §3), run under
// `mpirun -np N build/perf/dist_bench MODEL_DIR [--prompt P] [--gen G] [--threads T] [--mem-gb X]`
// (perf/dist_bench.sh runs N = 1, 2, 4). Every rank loads its slice (the head, the trunk, its experts)
// -- or with --mem-gb streams it through the flow graph within X GiB (docs/distributed.md §6: the
// exchange is the graph's expert_exchange node) -- prefills P ids, then
// decodes G tokens greedily; each decode step is timed, and the time each rank spent in its expert
// exchanges (the allgathers, including waiting for the slowest rank) is its communication. Rank 0
// prints one table row per run, next to the design page's prediction: messages per token = MoE
// layers, bytes a rank receives per token = MoE layers x top_k x latent x 4 x (N-1)/N on average.
// On one machine the ranks share the cores, so this shows the communication's cost, not a speedup.
#include <fmt/format.h>
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "io/config.hpp"
#include "io/error.hpp"
#include "io/safetensors.hpp"
#include "pipeline/graph/graph.hpp"
#include "pipeline/graph/planner.hpp"
#include "pipeline/graph/streaming_source.hpp"
#include "pipeline/ranks/mpi_comm.hpp"
#include "pipeline/ranks/rank_experts.hpp"
#include "pipeline/run/thread_limit.hpp"
#include "stages/bind.hpp"
#include "stages/forward.hpp"

using namespace k3;
namespace ranks = k3::pipeline::ranks;

namespace {

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// Per rank and decode step: wall seconds, seconds in exchanges, messages, bytes received.
struct Step {
  double wall = 0, comm = 0, messages = 0, received = 0;
};

int run(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(
        stderr,
        "usage: mpirun -np N dist_bench MODEL_DIR [--prompt P] [--gen G] [--threads T] [--mem-gb X]\n");
    return 2;
  }
  const std::string dir = argv[1];
  int prompt_len = 16, gen = 8, threads = 0;
  double mem_gb = 0;  // > 0: streamed per rank within this budget
  for (int i = 2; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--prompt")
      prompt_len = std::atoi(argv[i + 1]);
    else if (flag == "--gen")
      gen = std::atoi(argv[i + 1]);
    else if (flag == "--threads")
      threads = std::atoi(argv[i + 1]);
    else if (flag == "--mem-gb")
      mem_gb = std::atof(argv[i + 1]);
  }
  const pipeline::ThreadLimit limit(threads);  // ranks sharing one machine: cores / N each
  ranks::MpiComm comm;
  const io::ModelConfig cfg = io::load_config(dir + "/config.json");
  const io::ShardSet shards = io::ShardSet::open(dir);
  ranks::RankExperts experts(comm);
  const double t_load = now();
  std::unique_ptr<stages::ResidentModel> model;
  std::unique_ptr<pipeline::WeightSources> src;
  std::unique_ptr<pipeline::StreamingModel> streamed;
  uint64_t held_bytes = 0;
  const uint64_t context = uint64_t(prompt_len) + uint64_t(gen) + 1;
  if (mem_gb > 0) {  // the rank's own plan: its experts' slots, the exchange's buffers
    src = pipeline::WeightSources::open(cfg, shards, nullptr, 0);
    pipeline::PlanInputs in = src->plan_inputs(context, {});
    int owned = 0;
    for (int e = 0; e < cfg.n_experts; ++e) owned += experts.owns(e) ? 1 : 0;
    if (comm.size() > 1) pipeline::plan_rank_experts(in, cfg, owned, comm.size());
    pipeline::PlanBudget b;
    b.total = uint64_t(mem_gb * double(uint64_t{1} << 30));
    b.source = "--mem-gb";
    const pipeline::MemoryPlan plan = pipeline::make_plan(in, b);
    streamed = std::make_unique<pipeline::StreamingModel>(*src, plan, pipeline::Strategy::automatic, nullptr,
                                                          comm.size() > 1 ? &experts : nullptr,
                                                          pipeline::kDefaultExpertPolicy, limit.threads());
    streamed->expect_calls(gen + 1);
    held_bytes = streamed->allocated_bytes();
  } else {
    model = stages::ResidentModel::load(shards, cfg, 0, &experts);
    held_bytes = model->weight_bytes();
  }
  const double load_s = now() - t_load;

  std::vector<int32_t> ids;
  ids.reserve(size_t(std::max(prompt_len, 0)));
  for (int i = 0; i < prompt_len; ++i) ids.push_back(int32_t((i * 7919 + 13) % cfg.vocab));
  stages::DecodeState st(cfg, cfg.n_layers, context);
  stages::Scratch scratch;
  std::vector<float> logits(size_t(cfg.vocab));
  auto run_step = [&](std::span<const int32_t> feed) {
    if (streamed)
      streamed->forward(st, feed, logits);
    else
      stages::forward(*model, st, feed, stages::HeadAt::last, logits, scratch);
  };
  run_step(ids);  // prefill, not timed
  std::vector<Step> steps;
  steps.reserve(size_t(std::max(gen, 0)));
  for (int s = 0; s < gen; ++s) {
    const int32_t next = int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
    const ranks::RankExperts::Stats before = experts.stats();
    MPI_Barrier(MPI_COMM_WORLD);  // every rank starts the step together
    const double t0 = now();
    run_step(std::span(&next, 1));
    const ranks::RankExperts::Stats& after = experts.stats();
    steps.push_back(Step{.wall = now() - t0,
                         .comm = after.seconds - before.seconds,
                         .messages = double(after.messages - before.messages),
                         .received = double(after.bytes_received - before.bytes_received)});
  }
  // Rank 0 gathers every rank's medians.
  std::vector<double> walls, comms;
  walls.reserve(steps.size());
  comms.reserve(steps.size());
  for (const Step& st_ : steps) {
    walls.push_back(st_.wall);
    comms.push_back(st_.comm);
  }
  const double mine[5] = {median(walls), median(comms), steps.empty() ? 0 : steps.back().messages,
                          steps.empty() ? 0 : steps.back().received, double(held_bytes)};
  std::vector<double> all(size_t(5 * comm.size()));
  MPI_Gather(mine, 5, MPI_DOUBLE, all.data(), 5, MPI_DOUBLE, 0, MPI_COMM_WORLD);
  if (comm.rank() != 0) return 0;

  const int n = comm.size();
  int moe_layers = 0;
  for (int l = 0; l < cfg.n_layers; ++l) moe_layers += !cfg.is_dense(l);
  const double slots = double(cfg.top_k) * double(cfg.latent) * 4;
  double wall = 0, comm_s = 0, received = 0, weights = 0;
  for (size_t r = 0; r < size_t(n); ++r) {
    wall = std::max(wall, all[5 * r]);
    comm_s += all[5 * r + 1] / n;
    received += all[5 * r + 3] / n;
    weights = std::max(weights, all[5 * r + 4]);
  }
  fmt::print(
      "ranks {}{}: {:.4f} s/token (median step, slowest rank), of which exchange {:.4f} s ({:.0f} %), "
      "compute "
      "{:.4f} s; {:.0f} messages/token (predicted {}), {:.0f} B received per rank per token (predicted "
      "{:.0f}); "
      "largest rank holds {:.1f} MB, loaded in {:.2f} s\n",
      n, mem_gb > 0 ? fmt::format(" streamed within {} GiB each", mem_gb) : "", wall, comm_s,
      wall > 0 ? 100 * comm_s / wall : 0, wall - comm_s, all[2], n > 1 ? moe_layers : 0, received,
      moe_layers * slots * double(n - 1) / double(n), weights / 1e6, load_s);
  fmt::print(
      "{{\"ranks\":{},\"mem_gb\":{},\"s_per_token\":{:.6f},\"exchange_s_per_token\":{:.6f},\"messages_per_"
      "token\":{:.0f},"
      "\"predicted_messages\":{},\"received_bytes_per_token\":{:.0f},\"predicted_received_bytes\":{:.0f}}}\n",
      n, mem_gb, wall, comm_s, all[2], n > 1 ? moe_layers : 0, received,
      moe_layers * slots * double(n - 1) / double(n));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;  // the streamed graph exchanges from its worker threads, one at a time
  MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided);
  int code = 0;
  try {
    code = run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dist_bench: %s\n", e.what());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  MPI_Finalize();
  return code;
}
