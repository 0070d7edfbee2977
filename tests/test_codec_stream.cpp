// `k3flow generate` streamed from a COMPRESSED packed trunk (pack-trunk --codec exp4|exp3|huff) through the
// graph's decode stage (pipeline/graph/graph.hpp: trunk_read -> stored_order -> decode_claim ->
// trunk_decode -> trunk_bind), driven as a child process (K3FLOW_BIN):
//   - identical bits: ids and --dump-logits bytes equal the resident run's and the raw trunk's, for
//     serial / overlap / lookahead / auto, at the floor and a larger budget (0.0243 GiB: every layer
//     pinned, each read stored and decoded once), with 1 and 2 threads; fixtures/tiny-k3
//     gives its golden logits;
//   - the report counts stored bytes read, decoded bytes and decode seconds; plan prints the decode
//     slots and what the codec saves;
//   - a byte flipped inside a layer's stream: one line naming the codec, trunk.bin, the layer and a
//     file offset, exit 1, no logits file, never other output;
//   - the budget holds (peak RSS of the child under it) on a checkpoint over 3x the budget.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "tests/generate_helpers.hpp"
#include "tests/run_helpers.hpp"

namespace fs = std::filesystem;
using k3::test::field;
using k3::test::generate;
using k3::test::k3flow;
using k3::test::kTinyFull;
using k3::test::kTinyK3;
using k3::test::num;
using k3::test::Output;
using k3::test::Run;
using k3::test::slurp;
using k3::test::TempDir;

namespace {

// 8 layers (dense 0, MoE 1..7), 32 experts, top-4: ~14 MB in 3 shards; packed raw, exp4, exp3 and huff.
struct Synth {
  TempDir dir;
  std::string model, raw, exp4, exp3, huff;
  Synth() {
    model = dir / "m";
    raw = dir / "raw";
    exp4 = dir / "exp4";
    exp3 = dir / "exp3";
    huff = dir / "huff";
    Run s = k3flow(fmt::format("synth {} --size tiny --layers 8 --shards 3 --seed 4", model));
    REQUIRE_MESSAGE(s.code == 0, s.err);
    for (const auto& [dir_, codec] :
         {std::pair{raw, "none"}, {exp4, "exp4"}, {exp3, "exp3"}, {huff, "huff"}}) {
      Run p = k3flow(fmt::format("pack-trunk {} {} --codec {} --no-progress", model, dir_, codec));
      REQUIRE_MESSAGE(p.code == 0, p.err);
    }
  }
};

Synth& synth() {
  static Synth s;
  return s;
}

}  // namespace

TEST_CASE(
    "compressed trunk: streamed == raw trunk == resident bits, every strategy, floor and middle budget") {
  Synth& s = synth();
  TempDir d;
  const std::string ids = "5,900,17,17,3,640,201,88";
  const Output ref = generate(s.model, ids, "--gen 4 --incremental", d);
  // the floor (no pins, layer 0 spans the stored ring, one decode slot); 0.0243 GiB: every layer pinned,
  // read stored and decoded once -- as both trunks pin every layer there, the codec reads fewer bytes (at
  // 0.024 the activations planned for the pass leave exp4 5 of 8 pinned beside its 2 decode slots, raw 8)
  for (const char* budget : {"--preset ultra", "--mem-gb 0.0243"})
    for (const char* strategy : {"serial", "overlap", "lookahead", "auto"}) {
      const std::string flags = fmt::format("--gen 4 --incremental {} --strategy {}", budget, strategy);
      CAPTURE(flags);
      const Output raw = generate(s.model, ids, flags + " --trunk " + s.raw, d);
      CHECK(raw.ids == ref.ids);
      CHECK(raw.logits == ref.logits);
      for (const std::string& trunk : {s.exp4, s.exp3, s.huff}) {
        if (trunk == s.huff && std::string(budget) != "--preset ultra") continue;  // keep it short
        CAPTURE(trunk);
        const Output o = generate(s.model, ids, flags + " --trunk " + trunk, d);
        CHECK(o.ids == ref.ids);
        CHECK(o.logits == ref.logits);
        // stored bytes read, decoded bytes out of the decode stage: the codec reads fewer
        CHECK(num(o.report, "trunk_bytes_read") > 0);
        CHECK(num(o.report, "trunk_decoded_bytes") > num(o.report, "trunk_bytes_read"));
        CHECK(num(o.report, "trunk_bytes_read") < num(raw.report, "trunk_bytes_read"));
        CHECK(std::atof(field(o.report, "decode_seconds").c_str()) > 0);
        CHECK(field(o.report, "codec") == (trunk == s.exp4   ? "\"exp4\""
                                           : trunk == s.exp3 ? "\"exp3\""
                                                             : "\"huff\""));
      }
    }
  CHECK(field(ref.report, "codec") == "\"none\"");
  // full recompute, and 1 / 2 threads
  for (const char* threads : {"--threads 1", "--threads 2"}) {
    CAPTURE(threads);
    const Output r = generate(s.model, ids, fmt::format("--gen 3 {}", threads), d);
    for (const char* strategy : {"serial", "auto"})
      for (const std::string& trunk : {s.exp4, s.exp3}) {
        CAPTURE(trunk);
        const Output o = generate(
            s.model, ids,
            fmt::format("--gen 3 --preset ultra --strategy {} {} --trunk {}", strategy, threads, trunk), d);
        CHECK(o.ids == r.ids);
        CHECK(o.logits == r.logits);
      }
  }
  // the whole trunk pinned (decoded once each, staged through a one-slot ring)
  for (const std::string& trunk : {s.exp4, s.exp3}) {
    const Output all = generate(s.model, ids, "--gen 4 --incremental --mem-gb 1 --trunk " + trunk, d);
    CHECK(all.ids == ref.ids);
    CHECK(all.logits == ref.logits);
  }
}

TEST_CASE("fixtures/tiny-k3 from an exp4 or exp3 trunk at the floor: the golden logits") {
  TempDir d;
  const std::string golden = slurp(std::string(K3_FIXTURES) + "/golden/tiny_c_logits.bin");
  for (const char* codec : {"exp4", "exp3"}) {
    const std::string trunk = d / codec;
    REQUIRE(k3flow(fmt::format("pack-trunk {} {} --codec {} --no-progress", kTinyK3, trunk, codec)).code ==
            0);
    for (const char* strategy : {"serial", "overlap", "lookahead", "auto"}) {
      CAPTURE(codec);
      CAPTURE(strategy);
      const Output o =
          generate(kTinyK3, kTinyFull,
                   fmt::format("--gen 1 --preset ultra --strategy {} --trunk {}", strategy, trunk), d);
      CHECK(o.logits == golden);
      CHECK(o.ids == "6");
    }
  }
}

TEST_CASE("plan --trunk on a compressed trunk: the decode slots and what the codec saves") {
  Synth& s = synth();
  const Run p = k3flow(fmt::format("plan {} --trunk {} --preset ultra", s.model, s.exp4));
  REQUIRE_MESSAGE(p.code == 0, p.err);
  CHECK(p.out.find("trunk decode slots") != std::string::npos);
  CHECK(p.out.find("stored (compressed) bytes") != std::string::npos);
  CHECK(p.out.find("codec exp4: a token reads") != std::string::npos);
  CHECK(p.out.find("fewer bytes read") != std::string::npos);
  CHECK(p.out.find("fused decode (exp4)") != std::string::npos);  // exp4 and exp3: huff is staged
  const Run p3 = k3flow(fmt::format("plan {} --trunk {} --preset ultra", s.model, s.exp3));
  REQUIRE(p3.code == 0);
  CHECK(p3.out.find("codec exp3: a token reads") != std::string::npos);
  CHECK(p3.out.find("fused decode (exp3)") != std::string::npos);
  const Run h = k3flow(fmt::format("plan {} --trunk {} --preset ultra", s.model, s.huff));
  REQUIRE(h.code == 0);
  CHECK(h.out.find("codec huff: a token reads") != std::string::npos);
  CHECK(h.out.find("fused decode") == std::string::npos);
  const Run raw = k3flow(fmt::format("plan {} --trunk {} --preset ultra", s.model, s.raw));
  REQUIRE(raw.code == 0);
  CHECK(raw.out.find("decode slots") == std::string::npos);
}

TEST_CASE(
    "--trace gives the decode node its own lane; --graph-dot draws the decode stage, only for a codec") {
  Synth& s = synth();
  TempDir d;
  for (const std::string& trunk : {s.exp4, s.raw}) {
    CAPTURE(trunk);
    const bool compressed = trunk == s.exp4;
    const Output o =
        generate(s.model, "1,2,3",
                 fmt::format("--gen 2 --incremental --preset ultra --trunk {} --trace {} --graph-dot {}",
                             trunk, d / "t.json", d / "g.dot"),
                 d);
    const std::string trace = slurp(d / "t.json"), dot = slurp(d / "g.dot");
    CHECK((trace.find("\"node: trunk_decode\"") != std::string::npos) == compressed);
    CHECK((dot.find("\"trunk_read\" -> \"stored_order\"") != std::string::npos) == compressed);
    CHECK((dot.find("\"trunk_decode\" -> \"trunk_bind\"") != std::string::npos) == compressed);
    CHECK((dot.find("\"trunk_read\" -> \"trunk_bind\"") != std::string::npos) == !compressed);
    CHECK((o.out.find("trunk codec exp4:") != std::string::npos) == compressed);
  }
}

TEST_CASE("a corrupted compressed layer: one line naming trunk.bin, the layer and the offset, exit 1") {
  Synth& s = synth();
  TempDir d;
  const fs::path bad = fs::path(d / "bad");
  const std::string bad_dir = bad.string();
  fs::create_directories(bad);
  fs::copy_file(fs::path(s.exp4) / "trunk.json", bad / "trunk.json");
  fs::copy_file(fs::path(s.exp4) / "trunk.bin", bad / "trunk.bin");
  // layer 2's stream: trunk.json's file_off and compressed_bytes
  const std::string json = slurp(bad / "trunk.json");
  const size_t at = json.find("\"layer\":2,");
  REQUIRE(at != std::string::npos);
  const uint64_t off = std::strtoull(field(json.substr(at), "file_off").c_str(), nullptr, 10);
  const uint64_t len = std::strtoull(field(json.substr(at), "compressed_bytes").c_str(), nullptr, 10);
  REQUIRE(len > 4096);
  {
    std::fstream f(bad / "trunk.bin", std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(std::streamoff(off + len / 2));
    char c = 0;
    f.read(&c, 1);
    c = char(c ^ 0x10);
    f.seekp(std::streamoff(off + len / 2));
    f.write(&c, 1);
  }
  for (const char* strategy : {"serial", "auto"}) {
    CAPTURE(strategy);
    fs::remove(d / "l.bin");
    const Run r =
        k3flow(fmt::format("generate {} --ids 1,2,3 --gen 2 --preset ultra --strategy {} --trunk {} "
                           "--dump-logits {}",
                           s.model, strategy, bad_dir, d / "l.bin"));
    INFO(r.err);
    CHECK(!r.timed_out);
    CHECK(r.code == 1);
    CHECK(r.err.find("codec: ") != std::string::npos);
    CHECK(r.err.find((bad / "trunk.bin").string() + " layer 2") != std::string::npos);
    CHECK(r.err.find("corrupted") != std::string::npos);
    CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
    CHECK(!fs::exists(d / "l.bin"));
  }
}

TEST_CASE(
    "the budget holds from an exp4 trunk: a checkpoint over 3x the budget, the child's peak RSS under it") {
  TempDir d;
  const std::string model = d / "small", trunk = d / "t";
  REQUIRE(k3flow(fmt::format("synth {} --size small --seed 2", model)).code == 0);
  REQUIRE(k3flow(fmt::format("pack-trunk {} {} --codec exp4 --no-progress", model, trunk)).code == 0);
  uint64_t on_disk = 0;
  for (const auto& e : fs::directory_iterator(model)) on_disk += fs::file_size(e.path());
  const double gb = 0.09;
  const uint64_t budget = uint64_t(std::llround(gb * (1 << 30)));
  REQUIRE(on_disk >= 3 * budget);
  const Run r =
      k3flow(fmt::format("generate {} --ids 7,8,9 --gen 3 --incremental --mem-gb {} --trunk {} --out {}",
                         model, gb, trunk, d / "r.json"),
             "", 120);
  REQUIRE_MESSAGE(r.code == 0, std::string(r.out + r.err));
  MESSAGE(fmt::format("small ({} MB on disk), exp4 trunk, --mem-gb {} ({} B): child peak RSS {} B",
                      on_disk / 1000000, gb, budget, r.peak_rss));
#if defined(__SANITIZE_ADDRESS__) || defined(K3_SANITIZED)
  MESSAGE("sanitized build (K3_SANITIZED): shadow memory inflates RSS, the budget check is skipped");
#else
  CHECK(r.peak_rss <= budget);
#endif
  CHECK(num(slurp(d / "r.json"), "trunk_decoded_bytes") > num(slurp(d / "r.json"), "trunk_bytes_read"));
}

// A fused codec's decoded slot holds only what the decode stage writes (vectors, router, cut
// blocks): the plan counts those pages, the slot's other pages are never touched, and the first
// pass hashes the whole layer as it streams through a window. At the floor the child's peak RSS
// stays under the budget; with room beside the floor the ring gets a third slot -- same bits.
TEST_CASE(
    "exp3 at its floor: a compact decoded slot, peak RSS under the budget; room buys a third ring slot") {
  TempDir d;
  const std::string model = d / "small", trunk = d / "t", raw = d / "raw";
  REQUIRE(k3flow(fmt::format("synth {} --size small --seed 2", model)).code == 0);
  REQUIRE(k3flow(fmt::format("pack-trunk {} {} --codec exp3 --no-progress", model, trunk)).code == 0);
  REQUIRE(k3flow(fmt::format("pack-trunk {} {} --no-progress", model, raw)).code == 0);
  const Run p = k3flow(fmt::format("plan {} --trunk {} --preset ultra --json", model, trunk));
  REQUIRE_MESSAGE(p.code == 0, p.err);
  const uint64_t floor = uint64_t(num(p.out, "floor")), slot = uint64_t(num(p.out, "decode_slot_bytes"));
  const Run praw = k3flow(fmt::format("plan {} --trunk {} --preset ultra --json", model, raw));
  REQUIRE(praw.code == 0);
  // the decoded slot: a small part of the largest layer (17 MiB decoded); the floor under the raw one
  MESSAGE(fmt::format("exp3 floor {} B (decoded slot {} B), raw floor {} B", floor, slot,
                      num(praw.out, "floor")));
  CHECK(slot < (uint64_t(2) << 20));
  CHECK(floor < uint64_t(num(praw.out, "floor")));
  const std::string ids = "7,8,9";
  const Output ref = generate(model, ids, "--gen 3 --incremental", d);
  const Run r =
      k3flow(fmt::format("generate {} --ids {} --gen 3 --incremental --preset ultra --trunk {} --out {} "
                         "--dump-logits {}",
                         model, ids, trunk, d / "r.json", d / "l.bin"),
             "", 120);
  REQUIRE_MESSAGE(r.code == 0, std::string(r.out + r.err));
  CHECK(slurp(d / "l.bin") == ref.logits);
  MESSAGE(fmt::format("exp3 trunk at the floor ({} B): child peak RSS {} B", floor, r.peak_rss));
  K3_CHECK_UNLESS_SANITIZED(r.peak_rss <= floor);
  // room for one more stored slot: a third ring slot, same bits
  const double gb = double(floor + (uint64_t(16) << 20)) / double(1 << 30);
  const Run p3 = k3flow(fmt::format("plan {} --trunk {} --mem-gb {:.6f}", model, trunk, gb));
  REQUIRE(p3.code == 0);
  CHECK(p3.out.find("3 ring slots: reads run 2 layers ahead of compute") != std::string::npos);
  const Output o =
      generate(model, ids, fmt::format("--gen 3 --incremental --mem-gb {:.6f} --trunk {}", gb, trunk), d);
  CHECK(o.ids == ref.ids);
  CHECK(o.logits == ref.logits);
}
