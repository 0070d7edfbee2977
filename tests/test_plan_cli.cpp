// `k3flow plan` on the full-scale sparse replica of the released checkpoint (`k3flow synth
// --sparse`, headers only): the laptop / 32 / 128 GiB plans, the refusal below the floor, and the
// JSON's internal consistency.
#include <doctest/doctest.h>
#include <simdjson.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "tests/run_helpers.hpp"

namespace fs = std::filesystem;

namespace {

constexpr uint64_t kGiB = uint64_t{1} << 30;

using k3::test::Run;
using k3::test::slurp;
using k3::test::TempDir;

// `k3flow ARGS` (shell words), stdout and stderr captured apart.
Run k3flow(const std::string& args) { return k3::test::k3flow_sh(args); }

// One replica for the whole test binary (3 s, ~130 MB of headers on disk).
const fs::path& replica() {
  static TempDir dir;
  static fs::path model = [] {
    fs::path m = dir.path / "k3";
    Run r = k3flow("synth --sparse " + m.string());
    REQUIRE_MESSAGE(r.code == 0, r.err);
    return m;
  }();
  return model;
}

struct Parsed {
  simdjson::dom::parser parser;
  simdjson::dom::element doc;
};

uint64_t u(simdjson::dom::element e) {
  return uint64_t(e);
}

// Runs plan --json and checks what every plan must satisfy.
void plan(Parsed& p, const std::string& budget_args) {
  Run r = k3flow("plan " + replica().string() + " " + budget_args + " --json");
  REQUIRE_MESSAGE(r.code == 0, r.err);
  p.doc = p.parser.parse(r.out);
  uint64_t sum = 0;
  for (simdjson::dom::element pool : p.doc["pools"].get_array()) {
    if (u(pool["each"])) CHECK(u(pool["bytes"]) == u(pool["count"]) * u(pool["each"]));
    sum += u(pool["bytes"]);
  }
  CHECK(sum == u(p.doc["total"]));
  CHECK(u(p.doc["total"]) + u(p.doc["unassigned"]) == u(p.doc["budget"]));
  CHECK(u(p.doc["total"]) <= u(p.doc["budget"]));
  CHECK(u(p.doc["experts"]["slot_bytes"]) == 17'547'264 + 4096);  // one released expert + O_DIRECT page
  CHECK(u(p.doc["experts"]["inflight"]) == 16);
}

size_t pinned(Parsed& p) {
  return p.doc["trunk"]["pinned"].get_array().size();
}

}  // namespace

TEST_CASE("plan --preset laptop: within 8 GiB, a 2-slot ring, >= 16 expert slots") {
  Parsed p;
  plan(p, "--preset laptop");
  CHECK(u(p.doc["budget"]) == 8 * kGiB);
  CHECK(u(p.doc["total"]) <= 8 * kGiB);
  CHECK(u(p.doc["trunk"]["ring_slots"]) >= 2);
  CHECK(u(p.doc["experts"]["inflight"]) + u(p.doc["experts"]["lookahead"]) + u(p.doc["experts"]["cache"]) >=
        16);
  // The released layer 0 (dense FFN) is the outlier that spans the two slots.
  CHECK(int64_t(p.doc["trunk"]["spanning_layer"]) == 0);
  // Trunk bytes as pack-trunk lays them out: 93 layers, ~108.8 GB (ENGINE.md §1.4).
  CHECK(u(p.doc["trunk"]["trunk_bytes"]) > 108'000'000'000);
  CHECK(u(p.doc["trunk"]["trunk_bytes"]) < 110'000'000'000);

  Run text = k3flow("plan " + replica().string() + " --preset laptop");
  REQUIRE(text.code == 0);
  MESSAGE(text.out);
  CHECK(text.out.find("TOTAL") != std::string::npos);
  CHECK(text.out.find("trunk ring slots") != std::string::npos);
}

TEST_CASE("plan: 32 and 128 GiB pin more layers; 128 GiB holds the whole trunk") {
  Parsed p8, p32, p128;
  plan(p8, "--mem-gb 8");
  plan(p32, "--mem-gb 32");
  plan(p128, "--mem-gb 128");
  CHECK(pinned(p32) > pinned(p8));
  CHECK(pinned(p128) > pinned(p32));
  CHECK(pinned(p128) == 93);
  CHECK(u(p128.doc["trunk"]["streamed_bytes"]) == 0);
  CHECK(u(p128.doc["experts"]["cache"]) > u(p32.doc["experts"]["cache"]));
  MESSAGE(k3flow("plan " + replica().string() + " --mem-gb 32").out);
  MESSAGE(k3flow("plan " + replica().string() + " --mem-gb 128").out);
}

TEST_CASE("plan: split trunk / cache budgets and a longer context") {
  Parsed p;
  plan(p, "--trunk-gb 16 --cache-gb 4 --context 4096");
  uint64_t kv = 0;
  for (simdjson::dom::element pool : p.doc["pools"].get_array())
    if (std::string_view(pool["name"]).starts_with("MLA KV cache")) kv = u(pool["bytes"]);
  CHECK(kv == 4096ull * 2'365'440);  // ENGINE.md §1.4: 2,365,440 B per position over 24 MLA layers
}

TEST_CASE("plan: a 2 GiB budget is refused with exit 2 naming the shortfall") {
  Run r = k3flow("plan " + replica().string() + " --mem-gb 2");
  CHECK(r.code == 2);
  CHECK(r.out.empty());
  CHECK(r.err.find("short of the floor") != std::string::npos);
  CHECK(r.err.find(" B short") != std::string::npos);
  CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
}

TEST_CASE("plan: usage errors exit 2") {
  CHECK(k3flow("plan " + replica().string()).code == 2);                      // no budget
  CHECK(k3flow("plan " + replica().string() + " --preset phone").code == 2);  // unknown preset
  CHECK(k3flow("plan " + replica().string() + " --mem-gb 8 --preset laptop").code == 2);
  CHECK(k3flow("plan " + replica().string() + " --trunk-gb 8").code == 2);  // needs --cache-gb
  CHECK(k3flow("plan " + replica().string() + " --mem-gb -1").code == 2);
}
