// Expert parallel (docs/distributed.md §2) in one process: N ranks as threads (dist::ThreadGroup),
// each loading only its experts (ResidentModel::load with a RankExperts) and exchanging the expert
// slots it computed. Every rank's logits, step after step (prefill, then incremental decode and a
// batched pass), must be the single process's bytes, at N = 1..4, on the tiny oracle model and on
// a synthetic bf16 + MXFP4 checkpoint. Also: the status exchange that ends every rank's run when one
// cannot load, and the per-rank split `plan --ranks` prints. The same under mpirun: test_dist_mpi.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "io/config.hpp"
#include "io/safetensors.hpp"
#include "pipeline/dist/comm.hpp"
#include "pipeline/dist/rank_experts.hpp"
#include "pipeline/dist/split.hpp"
#include "stages/bind.hpp"
#include "stages/forward.hpp"
#include "tests/fixture_json.hpp"
#include "tests/run_helpers.hpp"

using namespace k3;
namespace dist = k3::pipeline::dist;

namespace {

struct Model {
  io::ModelConfig cfg;
  io::ShardSet shards;
  Model(const std::string& dir)
      : cfg(io::load_config(dir + "/config.json")), shards(io::ShardSet::open(dir)) {}
};

// Prefill `prompt`, then `steps` greedy decode steps fed one id at a time, then one batched pass of
// two sequences (forward_batch): every logit of every call, concatenated.
std::vector<float> decode(const stages::WeightSource& ws, const std::vector<int32_t>& prompt, int steps) {
  const io::ModelConfig& c = ws.config();
  const size_t V = size_t(c.vocab);
  stages::DecodeState st(c, ws.bound_layers(), prompt.size() + size_t(steps) + 2);
  stages::Scratch scratch;
  std::vector<float> logits(V), all;
  stages::forward(ws, st, prompt, stages::HeadAt::last, logits, scratch);
  all.insert(all.end(), logits.begin(), logits.end());
  for (int s = 0; s < steps; ++s) {
    int32_t next = 0;
    for (size_t v = 1; v < V; ++v)
      if (logits[v] > logits[size_t(next)]) next = int32_t(v);
    stages::forward(ws, st, std::span(&next, 1), stages::HeadAt::last, logits, scratch);
    all.insert(all.end(), logits.begin(), logits.end());
  }
  // Two sequences in one pass: more rows per expert, experts chosen by both.
  stages::DecodeState a(c, ws.bound_layers(), 8), b(c, ws.bound_layers(), 8);
  const std::vector<int32_t> ids = {prompt[0], 5, 9, 3, prompt.back()};
  const stages::Segment segs[] = {{.state = &a, .first_row = 0, .rows = 3},
                                  {.state = &b, .first_row = 3, .rows = 2}};
  std::vector<float> two(2 * V);
  stages::forward_batch(ws, segs, ids, two, scratch);
  all.insert(all.end(), two.begin(), two.end());
  return all;
}

// Every rank of an N-thread group decodes with only its experts; returns each rank's logits.
std::vector<std::vector<float>> decode_on_ranks(const Model& m, int n, const std::vector<int32_t>& prompt,
                                                int steps, std::vector<uint64_t>* weight_bytes = nullptr) {
  dist::ThreadGroup group(n);
  std::vector<std::vector<float>> out(static_cast<size_t>(n));
  if (weight_bytes) weight_bytes->assign(size_t(n), 0);
  group.run([&](dist::Comm& comm) {
    dist::RankExperts experts(comm);
    const auto model = stages::ResidentModel::load(m.shards, m.cfg, 0, &experts);
    if (weight_bytes) (*weight_bytes)[size_t(comm.rank())] = model->weight_bytes();
    out[size_t(comm.rank())] = decode(*model, prompt, steps);
  });
  return out;
}

bool same_bytes(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

void check_exact(const std::string& dir, const std::vector<int32_t>& prompt, int steps) {
  const Model m(dir);
  const auto whole = stages::ResidentModel::load(m.shards, m.cfg);
  const std::vector<float> ref = decode(*whole, prompt, steps);
  for (int n = 1; n <= 4; ++n) {
    CAPTURE(n);
    std::vector<uint64_t> bytes;
    const auto per_rank = decode_on_ranks(m, n, prompt, steps, &bytes);
    for (int r = 0; r < n; ++r) {
      CAPTURE(r);
      CHECK(same_bytes(per_rank[size_t(r)], ref));
      // Each rank holds only its experts: fewer bytes than the whole model once N > 1.
      if (n > 1) CHECK(bytes[size_t(r)] < whole->weight_bytes());
    }
  }
}

}  // namespace

TEST_CASE(
    "expert parallel on the tiny oracle model: every rank's logits are the single process's bytes, N = "
    "1..4") {
  check_exact(test::fixture_path("tiny-k3"), {1, 17, 200, 3, 42, 99, 7}, 6);
}

TEST_CASE("expert parallel on a synthetic bf16 + MXFP4 checkpoint: byte-identical logits, N = 1..4") {
  test::TempDir dir;
  const std::string model = dir / "m";
  // 6 layers (dense 0, MoE 1..5), 32 MXFP4 experts top-4, bf16 trunk, 2 shards.
  const test::Run s =
      test::k3flow(fmt::format("synth {} --size tiny --layers 6 --shards 2 --seed 11", model));
  REQUIRE_MESSAGE(s.code == 0, s.err);
  const Model m(model);
  REQUIRE(m.cfg.n_experts > 4);
  check_exact(model, {3, 1, 4, 1, 5, 9, 2, 6}, 5);
}

TEST_CASE("a rank holds only the experts it owns, and asking it for another's is an error") {
  const Model m(test::fixture_path("tiny-k3"));
  dist::ThreadGroup group(3);
  std::mutex mu;
  std::vector<std::string> errors;
  group.run([&](dist::Comm& comm) {
    dist::RankExperts experts(comm);
    const auto model = stages::ResidentModel::load(m.shards, m.cfg, 0, &experts);
    for (int e = 0; e < m.cfg.n_experts; ++e) {
      CHECK(experts.owns(e) == (e % 3 == comm.rank()));
      if (experts.owns(e)) continue;
      try {
        (void)model->expert(1, e);
      } catch (const io::Error& err) {
        std::lock_guard lock(mu);
        errors.push_back(err.what());
      }
    }
  });
  size_t not_owned = 0;
  for (int r = 0; r < 3; ++r)
    for (int e = 0; e < m.cfg.n_experts; ++e) not_owned += (e % 3 != r);
  REQUIRE(errors.size() == not_owned);
  CHECK(errors[0].find("held by another process") != std::string::npos);
}

TEST_CASE("one rank's load failure ends every rank's run with that rank's message") {
  dist::ThreadGroup group(3);
  std::vector<std::string> seen(3);
  std::vector<int> collective(3, 0), kinds(3, -1);
  group.run([&](dist::Comm& comm) {
    try {
      dist::on_every_rank(comm, "could not load its slice", [&] {
        if (comm.rank() == 1)
          throw io::runtime_error("/models/x/model-00002-of-00003.safetensors: truncated");
      });
    } catch (const dist::CollectiveError& e) {
      seen[size_t(comm.rank())] = e.what();
      collective[size_t(comm.rank())] = 1;
      kinds[size_t(comm.rank())] = int(e.kind());
    }
  });
  for (int r = 0; r < 3; ++r) {
    CAPTURE(r);
    CHECK(collective[size_t(r)] == 1);
    CHECK(kinds[size_t(r)] == int(io::ErrorKind::runtime));
    CHECK(seen[size_t(r)] ==
          "rank 1 of 3 could not load its slice: /models/x/model-00002-of-00003.safetensors: truncated");
  }
  // Nobody failed: nothing is thrown anywhere.
  group.run([](dist::Comm& comm) { CHECK_NOTHROW(dist::on_every_rank(comm, "loading", [] {})); });
}

TEST_CASE("the per-rank split: every expert on exactly one rank, bytes adding up to the whole") {
  const Model m(test::fixture_path("tiny-k3"));
  const auto whole = stages::ResidentModel::load(m.shards, m.cfg);
  for (int n : {1, 2, 3, 4}) {
    CAPTURE(n);
    const dist::RankSplit s = dist::split_ranks(m.shards, m.cfg, n);
    REQUIRE(s.per_rank.size() == size_t(n));
    int experts = 0;
    uint64_t expert_bytes = 0;
    for (const dist::RankShare& r : s.per_rank) {
      experts += r.experts_per_layer;
      expert_bytes += r.expert_bytes;
    }
    CHECK(experts == m.cfg.n_experts);
    CHECK(expert_bytes == s.all_expert_bytes);
    CHECK(s.head_bytes + s.trunk_bytes + s.all_expert_bytes == whole->weight_bytes());
    CHECK(s.moe_layers == m.cfg.n_layers - m.cfg.first_dense);
    CHECK(s.gather_bytes == uint64_t(m.cfg.top_k) * uint64_t(m.cfg.latent) * 4);
  }
}

TEST_CASE("k3flow plan --ranks N prints each rank's share; with a budget it is refused as usage") {
  const std::string tiny = test::fixture_path("tiny-k3");
  const Model m(tiny);
  const dist::RankSplit s = dist::split_ranks(m.shards, m.cfg, 3);
  const test::Run json = test::k3flow(fmt::format("plan {} --ranks 3 --json", tiny));
  REQUIRE_MESSAGE(json.code == 0, json.err);
  CHECK(json.out.find("\"ranks\":3,") != std::string::npos);
  CHECK(json.out.find(fmt::format("\"trunk_bytes\":{},", s.trunk_bytes)) != std::string::npos);
  for (const dist::RankShare& r : s.per_rank)
    CHECK(json.out.find(fmt::format("{{\"rank\":{},\"experts_per_layer\":{},\"expert_bytes\":{}}}", r.rank,
                                    r.experts_per_layer, r.expert_bytes)) != std::string::npos);
  const test::Run text = test::k3flow(fmt::format("plan {} --ranks 3", tiny));
  REQUIRE_MESSAGE(text.code == 0, text.err);
  CHECK(text.out.find("split over 3 ranks") != std::string::npos);
  CHECK(text.out.find(fmt::format("{} allgathers", s.moe_layers)) != std::string::npos);
  const test::Run budget = test::k3flow(fmt::format("plan {} --ranks 2 --mem-gb 1", tiny));
  CHECK(budget.code == 2);
  CHECK(budget.err.find("--ranks") != std::string::npos);
}

TEST_CASE("the prompt rank 0 read reaches every rank, whatever the others passed") {
  dist::ThreadGroup group(3);
  std::vector<std::string> got(3);
  group.run([&](dist::Comm& comm) {
    got[size_t(comm.rank())] =
        dist::from_rank0(comm, comm.rank() == 0 ? "Write a haiku about disks. 世界" : "x");
  });
  for (const std::string& g : got) CHECK(g == "Write a haiku about disks. 世界");
  dist::SingleComm one;
  CHECK(dist::from_rank0(one, "alone") == "alone");
}
