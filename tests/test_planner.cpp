// pipeline/graph/planner on hand-made byte counts: K3-shaped layers (docs/engine.md §1.4) and small cases
// that pin down slot spanning, largest-first pinning, the fixed point and the refusals.
#include <doctest/doctest.h>
#include <simdjson.h>

#include <algorithm>
#include <string>

#include "io/error.hpp"
#include "pipeline/graph/planner.hpp"

using k3::pipeline::MemoryPlan;
using k3::pipeline::PlanBudget;
using k3::pipeline::PlanInputs;

namespace {

constexpr uint64_t kGiB = uint64_t{1} << 30;
constexpr uint64_t kPage = 4096;

// K3 as docs/engine.md §1.4 describes it: layer 0 dense 2.341 GB, 68 KDA+MoE layers ~1.27 GB, 24 MLA+MoE
// layers ~0.845 GB; head 4.70 GB; 69 KDA states; 24 MLA layers of KV per position.
PlanInputs k3_like(uint64_t context = 128) {
  PlanInputs in;
  for (int l = 0; l < 93; ++l) {
    bool mla = l % 4 == 3 || l == 92;
    uint64_t b = l == 0 ? 2'341'216'112 : mla ? 845'000'000 : 1'270'000'000;
    in.layers.push_back({(b + kPage - 1) / kPage * kPage, 4 * 60'000});
  }
  in.resident = {{"embedding + lm_head + head vectors", 1, 4'697'706'496, 4'697'706'496},
                 {"KDA state", 69, 6'733'824, 69 * 6'733'824},
                 {"MLA KV cache", context, 2'365'440, context * 2'365'440},
                 {"scratch", 1, 40'000'000, 40'000'000},
                 {"tensor index", 1, 50'000'000, 50'000'000}};
  in.expert_bytes = 17'547'264;
  in.top_k = 16;
  return in;
}

PlanBudget total(uint64_t bytes, std::string source = "test") {
  PlanBudget b;
  b.total = bytes;
  b.source = std::move(source);
  return b;
}

void check_consistent(const MemoryPlan& p) {
  uint64_t sum = 0;
  for (const auto& t : p.pools) {
    CAPTURE(t.name);
    if (t.each) CHECK(t.bytes == t.count * t.each);
    sum += t.bytes;
  }
  CHECK(sum == p.total());
  CHECK(p.total() <= p.budget);
  auto it =
      std::find_if(p.pools.begin(), p.pools.end(), [](auto& t) { return t.name.rfind("pinned", 0) == 0; });
  REQUIRE(it != p.pools.end());
  CHECK(it->count == p.pinned.size());
  CHECK(p.streamed_bytes + it->bytes == p.trunk_bytes);
  if (!p.request.trunk && p.expert_slot_bytes) CHECK(p.unassigned() < p.expert_slot_bytes);
}

}  // namespace

TEST_CASE("laptop (8 GiB) plans K3 with a 2-slot ring, layer 0 spanning both, and >= 16 expert slots") {
  PlanInputs in = k3_like();
  PlanBudget b = total(k3::pipeline::preset_budget("laptop", in), "preset laptop");
  CHECK(b.total == 8 * kGiB);
  MemoryPlan p = k3::pipeline::make_plan(in, b);
  MESSAGE(k3::pipeline::format_plan(p));
  check_consistent(p);
  CHECK(p.total() <= 8 * kGiB);
  CHECK(p.ring_slots >= 2);
  CHECK(p.inflight_slots + p.lookahead_slots + p.cache_slots >= 16);
  CHECK(p.spanning_layer == 0);
  CHECK(p.span_slots == 2);
  CHECK(p.slot_read_bytes == (1'270'000'000 + kPage - 1) / kPage * kPage);  // the largest other layer
  CHECK(p.expert_slot_bytes == 17'547'264 + kPage);
}

TEST_CASE("bigger budgets pin more layers, largest first; the ring shrinks once layer 0 is pinned") {
  PlanInputs in = k3_like();
  MemoryPlan p8 = k3::pipeline::make_plan(in, total(8 * kGiB));
  MemoryPlan p32 = k3::pipeline::make_plan(in, total(32 * kGiB));
  MemoryPlan p128 = k3::pipeline::make_plan(in, total(128 * kGiB));
  for (const MemoryPlan* p : {&p8, &p32, &p128}) check_consistent(*p);
  CHECK(p32.pinned.size() > p8.pinned.size());
  CHECK(p128.pinned.size() > p32.pinned.size());
  // Layer 0 is the largest, so it is the first pinned; then slots hold the largest KDA layer.
  REQUIRE(!p32.pinned.empty());
  CHECK(p32.pinned.front() == 0);
  CHECK(p32.spanning_layer == -1);
  CHECK(p32.slot_read_bytes == p8.slot_read_bytes);
  // KDA layers (1.27 GB) are pinned before any MLA layer (0.845 GB) is.
  bool mla_pinned =
      std::any_of(p32.pinned.begin(), p32.pinned.end(), [](int l) { return l % 4 == 3 || l == 92; });
  bool kda_left = false;
  for (int l = 1; l < 93; ++l)
    if (!(l % 4 == 3 || l == 92) && !std::binary_search(p32.pinned.begin(), p32.pinned.end(), l))
      kda_left = true;
  CHECK(!(mla_pinned && kda_left));
  // 128 GiB holds the whole K3 trunk (~109 GB) with the head: resident trunk, no ring.
  CHECK(p128.pinned.size() == 93);
  CHECK(p128.ring_slots == 0);
  CHECK(p128.streamed_bytes == 0);
}

TEST_CASE("a budget below the floor is refused naming the missing bytes") {
  PlanInputs in = k3_like();
  uint64_t floor = k3::pipeline::plan_floor(in);
  CHECK(k3::pipeline::preset_budget("ultra", in) == floor);
  CHECK_NOTHROW(k3::pipeline::make_plan(in, total(floor)));
  try {
    k3::pipeline::make_plan(in, total(2 * kGiB, "--mem-gb 2"));
    FAIL("2 GiB was accepted");
  } catch (const k3::io::Error& e) {
    std::string m = e.what();
    CHECK(e.kind() == k3::io::ErrorKind::usage);
    CHECK(m.find(std::to_string(floor - 2 * kGiB) + " B short") != std::string::npos);
    CHECK(m.find('\n') == std::string::npos);
  }
  CHECK_THROWS_AS(k3::pipeline::preset_budget("phone", in), k3::io::Error);
}

TEST_CASE("the ultra preset is exactly the floor and still gives every pool its minimum") {
  PlanInputs in = k3_like(0);
  MemoryPlan p = k3::pipeline::make_plan(in, total(k3::pipeline::preset_budget("ultra", in)));
  check_consistent(p);
  CHECK(p.total() == p.floor);
  CHECK(p.ring_slots == 2);
  CHECK(p.inflight_slots == 16);
  CHECK(p.lookahead_slots == 0);
  CHECK(p.pinned.empty());
}

TEST_CASE("pinning iterates to a fixed point: a pin that shrinks the slot frees room for more") {
  // Pages: one 10-page outlier and three 4-page layers, ring of 2.
  PlanInputs in;
  in.layers = {{10 * kPage, 0}, {4 * kPage, 0}, {4 * kPage, 0}, {4 * kPage, 0}};
  // Floor: slot = max(4, 10/2 = 5) pages, the outlier spans 2 slots: ring 10 pages.
  CHECK(k3::pipeline::plan_floor(in) == 10 * kPage);
  MemoryPlan floor = k3::pipeline::make_plan(in, total(10 * kPage));
  CHECK(floor.spanning_layer == 0);
  CHECK(floor.span_slots == 2);
  CHECK(floor.slot_read_bytes == 5 * kPage);
  // 24 pages: pass 1 pins the outlier and one 4-page layer (ring still 10); pass 2 sees the ring
  // would now be 2 x 4 pages and the last two layers fit in its place: the trunk becomes resident.
  MemoryPlan p = k3::pipeline::make_plan(in, total(24 * kPage));
  check_consistent(p);
  CHECK(p.pinned.size() == 4);
  CHECK(p.ring_slots == 0);
  CHECK(p.total() == 22 * kPage);
  // 20 pages: the outlier is pinned and the ring is 8 pages; 2 pages stay unassigned.
  MemoryPlan q = k3::pipeline::make_plan(in, total(20 * kPage));
  CHECK(q.pinned == std::vector<int>{0});
  CHECK(q.ring_slots == 2);
  CHECK(q.slot_read_bytes == 4 * kPage);
  CHECK(q.total() == 18 * kPage);
}

TEST_CASE("a layer that would span every ring slot is pinned when that costs at most 25 % more reads") {
  // `wide`-shaped in pages: layers 3, 7, 11, 15 are 10 pages, the twelve others 14. At 194 pages the
  // fixed point streams one 14-page layer and two 10-page ones (34 pages a token) through a ring of
  // 2 x 10 pages, which the 14-page layer spans whole: nothing can be read while the layer before it
  // in the ring waits to be computed, nor after it until it has been. Pinning every 14-page layer
  // instead streams the four small ones (40 pages, 18 % more) through the same ring, none spanning.
  PlanInputs in;
  for (int l = 0; l < 16; ++l) in.layers.push_back({(l % 4 == 3 ? 10 : 14) * kPage, 0});
  MemoryPlan p = k3::pipeline::make_plan(in, total(194 * kPage));
  check_consistent(p);
  CHECK(p.spanning_layer == -1);
  CHECK(p.ring_slots == 2);
  CHECK(p.slot_read_bytes == 10 * kPage);
  CHECK(p.streamed_bytes == 40 * kPage);
  CHECK(p.pinned == std::vector<int>{0, 1, 2, 4, 5, 6, 8, 9, 10, 12, 13, 14});

  // Where pinning the spanning layer does not fit, the span stays: a 10-page outlier beside 4-page
  // layers (the fixed-point case above), at its floor and just above it.
  PlanInputs outlier;
  outlier.layers = {{10 * kPage, 0}, {4 * kPage, 0}, {4 * kPage, 0}, {4 * kPage, 0}};
  MemoryPlan f = k3::pipeline::make_plan(outlier, total(10 * kPage));
  CHECK(f.spanning_layer == 0);
  CHECK(f.span_slots == 2);
  // 14 pages: pinning the outlier needs 10 + a 2 x 4-page ring = 18: it does not fit, the span stays.
  MemoryPlan g = k3::pipeline::make_plan(outlier, total(14 * kPage));
  check_consistent(g);
  CHECK(g.spanning_layer == 0);
}

TEST_CASE("streamed layers of one size are spread over the token, not bunched after the pinned ones") {
  // 16 equal layers, room for the 2-slot ring and 8 pins: streamed every other layer (first pick
  // layer 0, then each the farthest from those already streamed, cyclically; ties to the lower).
  PlanInputs even;
  even.layers.assign(16, {4 * kPage, 0});
  MemoryPlan p = k3::pipeline::make_plan(even, total((8 + 8 * 4) * kPage));
  check_consistent(p);
  CHECK(p.pinned == std::vector<int>{1, 3, 5, 7, 9, 11, 13, 15});
  CHECK(p.streamed_bytes == 8 * 4 * kPage);

  // `wide`-shaped: layers 3, 7, 11, 15 smaller (all streamed), 7 of the 12 others pinned. Lowest
  // index first would stream 3, 7 and 9..15 (seven in a row); spread, the only adjacent streamed
  // layers are 15, 0, 1 (nine of sixteen cannot all be apart).
  PlanInputs wide;
  for (int l = 0; l < 16; ++l) wide.layers.push_back({(l % 4 == 3 ? 3 : 4) * kPage, 0});
  MemoryPlan q = k3::pipeline::make_plan(wide, total((8 + 7 * 4) * kPage));
  check_consistent(q);
  CHECK(q.pinned == std::vector<int>{2, 4, 6, 8, 10, 12, 14});
  CHECK(q.streamed_bytes == (5 * 4 + 4 * 3) * kPage);  // the same sizes as lowest-index pinning
  CHECK(q.slot_read_bytes == 4 * kPage);
}

TEST_CASE("a trunk smaller than the ring is planned resident") {
  PlanInputs in;
  in.layers = {{3 * kPage, kPage}, {3 * kPage, kPage}};
  CHECK(k3::pipeline::plan_floor(in) == 8 * kPage);
  MemoryPlan p = k3::pipeline::make_plan(in, total(8 * kPage));
  CHECK(p.ring_slots == 0);
  CHECK(p.pinned.size() == 2);
}

TEST_CASE("split budgets: ring + pins within --trunk-gb, expert slots within --cache-gb") {
  PlanInputs in = k3_like();
  PlanBudget b;
  b.trunk = 16 * kGiB;
  b.experts = 2 * kGiB;
  b.source = "--trunk-gb 16 --cache-gb 2";
  MemoryPlan p = k3::pipeline::make_plan(in, b);
  check_consistent(p);
  uint64_t trunk = 0, experts = 0;
  for (const auto& t : p.pools) {
    if (t.name.find("trunk") != std::string::npos) trunk += t.bytes;
    if (t.name.find("expert") != std::string::npos) experts += t.bytes;
  }
  CHECK(trunk <= 16 * kGiB);
  CHECK(experts <= 2 * kGiB);
  CHECK(2 * kGiB - experts < p.expert_slot_bytes);
  CHECK(!p.pinned.empty());
  b.trunk = kGiB;  // below the 2-slot ring
  CHECK_THROWS_AS(k3::pipeline::make_plan(in, b), k3::io::Error);
  b.trunk = 16 * kGiB;
  b.experts = 100 << 20;  // below 16 in-flight slots
  CHECK_THROWS_AS(k3::pipeline::make_plan(in, b), k3::io::Error);
}

TEST_CASE("plan JSON: pools sum to total, fields agree with the plan") {
  MemoryPlan p = k3::pipeline::make_plan(k3_like(), total(32 * kGiB, "--mem-gb 32"));
  std::string j = k3::pipeline::plan_json(p);
  simdjson::dom::parser parser;
  simdjson::dom::element doc = parser.parse(j);
  uint64_t sum = 0;
  for (simdjson::dom::element pool : doc["pools"].get_array()) sum += uint64_t(pool["bytes"]);
  CHECK(sum == uint64_t(doc["total"]));
  CHECK(uint64_t(doc["total"]) == p.total());
  CHECK(uint64_t(doc["budget"]) == 32 * kGiB);
  CHECK(uint64_t(doc["total"]) + uint64_t(doc["unassigned"]) == uint64_t(doc["budget"]));
  CHECK(doc["trunk"]["pinned"].get_array().size() == p.pinned.size());
  CHECK(std::string_view(doc["source"]) == "--mem-gb 32");
}

TEST_CASE(
    "a budget past the model's size: every layer pinned, no ring, one slot per routed expert, the rest "
    "unassigned") {
  PlanInputs in = k3_like();
  in.routed_experts = 92 * 896;
  // K3: ~109 GB of trunk and 92 x 896 experts of 17.5 MB (~1.45 TB): 2 TiB holds it all.
  const MemoryPlan a = k3::pipeline::make_plan(in, total(2048 * kGiB));
  const MemoryPlan b = k3::pipeline::make_plan(in, total(8192 * kGiB));
  for (const MemoryPlan* p : {&a, &b}) {
    CHECK(p->pinned.size() == 93);
    CHECK(p->ring_slots == 0);
    CHECK(p->streamed_bytes == 0);
    CHECK(p->inflight_slots + p->lookahead_slots + p->cache_slots == in.routed_experts);
    CHECK(p->holds_model());
    CHECK(p->unassigned() > 0);
    CHECK(k3::pipeline::format_plan(*p).find("left unallocated") != std::string::npos);
  }
  CHECK(a.total() == b.total());
  uint64_t resident = 0;
  for (const auto& t : in.resident) resident += t.bytes;
  CHECK(a.total() == resident + a.trunk_bytes + in.routed_experts * a.expert_slot_bytes);

  // Split budgets are capped the same way.
  PlanBudget split;
  split.trunk = 512 * kGiB;
  split.experts = 4096 * kGiB;
  split.source = "split";
  const MemoryPlan s = k3::pipeline::make_plan(in, split);
  CHECK(s.total() == a.total());

  // A plan one byte short of holding everything does not claim to.
  const MemoryPlan short_one = k3::pipeline::make_plan(in, total(a.total() - 1));
  CHECK(!short_one.holds_model());
  CHECK(k3::pipeline::format_plan(short_one).find("left unallocated") == std::string::npos);
}

TEST_CASE("fewer routed experts than in-flight + lookahead slots: no lookahead, the cache holds the rest") {
  PlanInputs in = k3_like();
  in.routed_experts = 20;  // top_k 16: 16 in flight, no room for 16 more
  const MemoryPlan p = k3::pipeline::make_plan(in, total(512 * kGiB));
  CHECK(p.inflight_slots == 16);
  CHECK(p.lookahead_slots == 0);
  CHECK(p.cache_slots == 4);
  CHECK(p.holds_model());
}

// A compressed trunk (planner.hpp, "Compressed trunk"): a fused codec (exp4, exp3) holds its ring slots
// through compute, so room beside the floor buys a third ring slot (reads two layers ahead); a staged
// codec (huff) gets a second decode slot from the same room instead.
TEST_CASE(
    "compressed trunk: a fused codec's room goes to a third ring slot, a staged codec's to a decode slot") {
  PlanInputs in;
  for (int l = 0; l < 12; ++l)  // 100 pages decoded, 70 stored (exp3-like); layer 0 twice as large
    in.layers.push_back({.read_bytes = (l ? 100 : 200) * kPage,
                         .widen_bytes = kPage,
                         .stored_bytes = (l ? 70 : 140) * kPage});
  in.resident = {{"resident", 1, 50 * kPage, 50 * kPage}};
  for (const char* codec : {"exp3", "exp4", "huff"}) {
    CAPTURE(codec);
    in.codec = codec;
    const bool fused = std::string(codec) != "huff";
    const uint64_t floor = k3::pipeline::plan_floor(in);
    // floor: resident + ring of 2 x 70 pages (layer 0 spans it) + one decode slot of 200 + 1 pages
    CHECK(floor == (50 + 2 * 70 + 201) * kPage);
    const MemoryPlan at_floor = k3::pipeline::make_plan(in, total(floor));
    check_consistent(at_floor);
    CHECK(at_floor.ring_slots == 2);
    CHECK(at_floor.decode_slots == 1);
    CHECK(at_floor.pinned.empty());
    // room for one more ring slot (70 pages) but not a second decode slot (201)
    const MemoryPlan room = k3::pipeline::make_plan(in, total(floor + 80 * kPage));
    check_consistent(room);
    CHECK(room.ring_slots == (fused ? 3 : 2));
    CHECK(room.decode_slots == 1);
    CHECK(room.slot_read_bytes == 70 * kPage);
    const std::string text = k3::pipeline::format_plan(room);
    CHECK((text.find("3 ring slots: reads run 2 layers ahead of compute") != std::string::npos) == fused);
    // room for a second decode slot: huff takes it, a fused codec keeps one and pins instead
    const MemoryPlan more = k3::pipeline::make_plan(in, total(floor + 300 * kPage));
    check_consistent(more);
    CHECK(more.ring_slots == (fused ? 3 : 2));
    CHECK(more.decode_slots == (fused ? 1 : 2));
    // an explicit --ring 4 is kept as asked
    PlanBudget four = total(floor + 300 * kPage);
    four.ring_slots = 4;
    if (fused) CHECK(k3::pipeline::make_plan(in, four).ring_slots == 4);
  }
}
