// MoeLayerRun (pipeline/graph/moe_layer_run.*), the streaming graph's MoE wave state machine, run alone
// against a real ExpertCache with fewer slots than the layer's unique experts, in the order the
// graph's nodes drive it: router begin(), expert_fetch claim(), expert_landed landed(),
// expert_compute computed(), and the pieces combine waits for.
#include <doctest/doctest.h>

#include <cstdint>
#include <vector>

#include "io/config.hpp"
#include "pipeline/graph/expert_cache.hpp"
#include "pipeline/graph/moe_layer_run.hpp"

using k3::pipeline::ExpertCache;
using k3::pipeline::ExpertCounters;
using k3::pipeline::MoeLayerRun;
using k3::pipeline::graph_detail::ExpertGo;
using k3::pipeline::graph_detail::ReadBatch;
using k3::pipeline::graph_detail::Visit;

namespace {

const k3::io::ModelConfig& config() {  // tiny-k3: 8 experts, top_k 2
  static const k3::io::ModelConfig c = k3::io::load_config(K3_FIXTURES "/tiny-k3/config.json");
  return c;
}

// Three tokens choosing (5, 1), (3, 5), (7, 2): five unique experts 1 2 3 5 7, in that group order.
const std::vector<int32_t> kIdx = {5, 1, 3, 5, 7, 2};
constexpr int kLayer = 3;

std::vector<int> experts_of(const ReadBatch& b) {
  std::vector<int> e;
  for (const auto& it : b.items) e.push_back(it.expert);
  return e;
}
std::vector<int> groups_of(const std::vector<ExpertGo>& go) {
  std::vector<int> g;
  for (const ExpertGo& x : go) g.push_back(x.group);
  return g;
}

}  // namespace

TEST_CASE("moe layer run: groups in expert order with their rows and disjoint scratch") {
  REQUIRE(config().top_k == 2);
  MoeLayerRun run(MoeLayerRun::Waves::none);
  run.begin(Visit{0, kLayer}, kIdx, config(), 1);
  REQUIRE(run.unique() == 5);
  CHECK(run.visit().step == 0);
  CHECK(run.layer() == kLayer);
  const int experts[] = {1, 2, 3, 5, 7};
  for (size_t g = 0; g < 5; ++g) CHECK(run.expert(g) == experts[g]);
  CHECK(std::vector<uint32_t>(run.rows(3).begin(), run.rows(3).end()) == std::vector<uint32_t>{0, 3});
  CHECK(run.apply_offset(0) == 0);
  CHECK(run.apply_offset(4) > run.apply_offset(3));  // each group its own scratch
  for (size_t g = 0; g < 5; ++g) CHECK(run.slot(g) == -1);
}

TEST_CASE("moe layer run, trunk: waves of the free slots, held until the wave has landed") {
  ExpertCache cache(2, 4096, 0, 13, 8);
  ExpertCounters counts;
  MoeLayerRun run(MoeLayerRun::Waves::trunk);
  const Visit v{7, kLayer};
  run.begin(v, kIdx, config(), 1);  // + the shared experts

  std::vector<int> hits;
  ReadBatch batch;
  MoeLayerRun::Claim cl = run.claim(v, cache, counts, hits, batch);
  CHECK_FALSE(cl.stale);
  CHECK(cl.first);
  CHECK(hits.empty());
  CHECK(experts_of(batch) == std::vector<int>{1, 2});  // the first wave: as many as there are slots
  CHECK(counts.requests.load() == 2);
  CHECK(counts.hits.load() == 0);
  CHECK(run.starving());

  // No slot freed: a retry claims nothing.
  ReadBatch none;
  cl = run.claim(v, cache, counts, hits, none);
  CHECK_FALSE(cl.first);
  CHECK(none.items.empty());

  auto bind = [&](int slot) { return cache.landed(slot, true); };
  std::vector<ExpertGo> go;
  // The second group lands first: held, nothing computes, the shared experts wait.
  CHECK(cache.landed(batch.items[1].slot, true) == 1);
  MoeLayerRun::Landed l = run.landed(1, -1, bind, go);
  CHECK(go.empty());
  CHECK_FALSE(l.start_shared);
  CHECK(cache.landed(batch.items[0].slot, true) == 0);
  l = run.landed(0, -1, bind, go);
  CHECK(groups_of(go) == std::vector<int>{1, 0});  // the wave, in landing order
  CHECK(l.start_shared);
  CHECK(l.visit.step == 7);
  CHECK(go[0].slot == batch.items[1].slot);

  // Computing the first expert frees a slot: fetch again, and the next group takes it.
  cache.release(go[0].slot);
  CHECK(run.computed());
  CHECK_FALSE(run.piece_done());
  ReadBatch wave2;
  run.claim(v, cache, counts, hits, wave2);
  CHECK(experts_of(wave2) == std::vector<int>{3});
  cache.release(go[1].slot);
  CHECK(run.computed());
  CHECK_FALSE(run.piece_done());
  ReadBatch wave2b;
  run.claim(v, cache, counts, hits, wave2b);
  CHECK(experts_of(wave2b) == std::vector<int>{5});
  CHECK(run.starving());  // expert 7 still waits

  // The shared experts' piece, then the remaining experts; combine only after the very last.
  CHECK_FALSE(run.piece_done());
  go.clear();
  cache.landed(wave2.items[0].slot, true);
  run.landed(2, -1, bind, go);
  cache.landed(wave2b.items[0].slot, true);
  l = run.landed(3, -1, bind, go);
  CHECK(groups_of(go) == std::vector<int>{2, 3});
  CHECK_FALSE(l.start_shared);  // only with the first wave
  cache.release(go[0].slot);
  CHECK(run.computed());
  CHECK_FALSE(run.piece_done());
  ReadBatch wave3;
  run.claim(v, cache, counts, hits, wave3);
  CHECK(experts_of(wave3) == std::vector<int>{7});
  CHECK_FALSE(run.starving());
  cache.release(go[1].slot);
  CHECK_FALSE(run.computed());  // nothing waits for a slot any more
  CHECK_FALSE(run.piece_done());
  go.clear();
  cache.landed(wave3.items[0].slot, true);
  run.landed(4, -1, bind, go);
  CHECK(groups_of(go) == std::vector<int>{4});
  cache.release(go[0].slot);
  CHECK_FALSE(run.computed());
  CHECK(run.piece_done());  // 5 groups + shared: the sixth piece is the last
  CHECK(counts.requests.load() == 5);
}

TEST_CASE("moe layer run, serial: a wave is bound when complete, the next claimed once it is computed") {
  ExpertCache cache(2, 4096, 0, 13, 8);
  ExpertCounters counts;
  MoeLayerRun run(MoeLayerRun::Waves::serial);
  const Visit v{0, kLayer};
  run.begin(v, kIdx, config(), 1);
  std::vector<int> hits;
  ReadBatch batch;
  run.claim(v, cache, counts, hits, batch);
  REQUIRE(batch.items.size() == 2);

  std::vector<int> bound;
  auto bind = [&](int slot) {
    bound.push_back(slot);
    return cache.landed(slot, true);
  };
  std::vector<ExpertGo> go;
  CHECK_FALSE(run.completes_wave());
  run.landed(-1, batch.items[0].slot, bind, go);  // noted, not bound
  CHECK(bound.empty());
  CHECK(go.empty());
  CHECK(run.completes_wave());
  const MoeLayerRun::Landed l = run.landed(-1, batch.items[1].slot, bind, go);
  CHECK(bound == std::vector<int>{batch.items[0].slot, batch.items[1].slot});  // the wave, in landing order
  CHECK(groups_of(go) == std::vector<int>{0, 1});
  CHECK_FALSE(l.start_shared);  // serial computes the shared experts before any read

  cache.release(go[0].slot);
  CHECK_FALSE(run.computed());  // a slot is free, but the wave is still computing
  cache.release(go[1].slot);
  CHECK(run.computed());  // now the next wave is read
  ReadBatch wave2;
  run.claim(v, cache, counts, hits, wave2);
  CHECK(experts_of(wave2) == std::vector<int>{3, 5});
}

TEST_CASE("moe layer run, overlap: each expert goes as it lands; resident experts are hits; stale retries") {
  ExpertCache cache(2, 4096, 0, 13, 8);
  ExpertCounters counts;
  MoeLayerRun run(MoeLayerRun::Waves::none);
  const std::vector<int32_t> idx = {5, 1, 1, 5, 5, 1};  // experts 1 and 5
  run.begin(Visit{0, kLayer}, idx, config(), 2);        // + shared + lookahead
  std::vector<int> hits;
  ReadBatch batch;
  run.claim(Visit{0, kLayer}, cache, counts, hits, batch);
  REQUIRE(batch.items.size() == 2);
  auto bind = [&](int slot) { return cache.landed(slot, true); };
  std::vector<ExpertGo> go;
  for (int g = 0; g < 2; ++g) {
    CHECK(cache.landed(batch.items[size_t(g)].slot, true) == g);
    go.clear();
    run.landed(g, -1, bind, go);
    REQUIRE(go.size() == 1);  // computed at once, not held for the wave
    CHECK(go[0].group == g);
    cache.release(go[0].slot);
    CHECK_FALSE(run.computed());
  }
  int pieces = 0;
  while (!run.piece_done()) ++pieces;
  CHECK(pieces == 3);  // 2 groups + shared + lookahead: the fourth is the last

  // The next step's same layer finds both experts resident.
  run.begin(Visit{1, kLayer}, idx, config(), 1);
  hits.clear();
  ReadBatch again;
  const MoeLayerRun::Claim cl = run.claim(Visit{1, kLayer}, cache, counts, hits, again);
  CHECK(cl.first);
  CHECK(again.items.empty());
  CHECK(hits == std::vector<int>{0, 1});
  CHECK(counts.hits.load() == 2);
  CHECK(counts.requests.load() == 4);
  // A retry sent for the previous step's layer changes nothing.
  ReadBatch stale;
  CHECK(run.claim(Visit{0, kLayer}, cache, counts, hits, stale).stale);
  CHECK(counts.requests.load() == 4);
  int waiting = 0;
  run.if_waiting_for_slots([&](Visit) { ++waiting; });
  CHECK(waiting == 0);
}
