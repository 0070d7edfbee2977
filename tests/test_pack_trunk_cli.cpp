// `k3flow pack-trunk` end to end on a synthetic checkpoint (`k3flow synth`): bytes equal the
// shards', --verify, progress only when asked (stderr is not a TTY here), `plan --trunk` agrees
// with the layout planned from the shards, interrupted packs (exception or SIGKILL) leave no
// trunk.json / trunk.bin, and a trunk of another model is refused naming trunk.json.
#include <doctest/doctest.h>
#include <simdjson.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "io/config.hpp"
#include "io/packed_trunk.hpp"
#include "io/safetensors.hpp"
#include "tests/run_helpers.hpp"

namespace fs = std::filesystem;

namespace {

using k3::test::slurp;

// Under the build directory (the tests' working directory): real disk.
struct TempDir : k3::test::TempDir {
  TempDir() : k3::test::TempDir(fs::current_path(), "k3_pack_cli_") {}
};

struct Run {
  int code;  // exit status, or 128 + signal
  std::string out, err;
};

Run k3flow(const std::string& args, const std::string& env = "") {
  // exec: the shell's status is then k3flow's own, so a signal shows as one (r.signal).
  const k3::test::Run r = k3::test::shell(env + " exec " + std::string(K3FLOW_BIN) + " " + args);
  return {r.signal != 0 ? 128 + r.signal : r.code, r.out, r.err};
}

fs::path synth(const fs::path& dir, const std::string& args) {
  Run r = k3flow("synth " + dir.string() + " " + args + " --no-progress");
  REQUIRE_MESSAGE(r.code == 0, r.err);
  return dir;
}

}  // namespace

TEST_CASE("pack-trunk writes every layer's trunk byte-exactly; --verify passes; plan --trunk agrees") {
  TempDir tmp;
  fs::path model = synth(tmp.path / "model", "--size tiny --shards 3");
  fs::path trunk = tmp.path / "trunk";
  Run r = k3flow("pack-trunk " + model.string() + " " + trunk.string() + " --verify");
  REQUIRE_MESSAGE(r.code == 0, r.err);
  CHECK(r.err.empty());  // no progress bar: stderr is not a terminal
  CHECK(r.out.find("verified") != std::string::npos);

  k3::io::ModelConfig c = k3::io::load_config(model / "config.json");
  k3::io::ShardSet shards = k3::io::ShardSet::open(model);
  k3::io::PackedTrunk t = k3::io::PackedTrunk::open(trunk, c.n_layers);
  size_t tensors = 0;
  for (const auto& L : t.layers()) {
    CHECK(L.file_off % 4096 == 0);
    std::vector<std::byte> layer(L.nbytes);
    t.file().read_exact(L.file_off, layer);
    for (const auto& tt : L.tensors) {
      CAPTURE(tt.name);
      auto src = shards.find(tt.name);
      REQUIRE(src);
      std::vector<std::byte> want(src->nbytes);
      shards.read(*src, want);
      CHECK(std::equal(want.begin(), want.end(), layer.begin() + long(tt.off)));
      ++tensors;
    }
  }
  size_t trunk_tensors = 0;
  shards.for_each([&](std::string_view n, const k3::io::TensorInfo&) {
    trunk_tensors += k3::io::trunk_layer_of(n) >= 0;
  });
  CHECK(tensors == trunk_tensors);

  // The plan from the packed trunk sees the same per-layer bytes as the plan from the shards.
  simdjson::dom::parser p1, p2;
  Run a = k3flow("plan " + model.string() + " --mem-gb 1 --json");
  Run b = k3flow("plan " + model.string() + " --trunk " + trunk.string() + " --mem-gb 1 --json");
  REQUIRE_MESSAGE(a.code == 0, a.err);
  REQUIRE_MESSAGE(b.code == 0, b.err);
  simdjson::dom::element ja = p1.parse(a.out), jb = p2.parse(b.out);
  CHECK(uint64_t(ja["trunk"]["trunk_bytes"]) == uint64_t(jb["trunk"]["trunk_bytes"]));
  CHECK(std::string_view(jb["source"]).find(trunk.string()) != std::string_view::npos);

  Run forced = k3flow("pack-trunk " + model.string() + " " + (tmp.path / "trunk2").string() + " --progress");
  REQUIRE(forced.code == 0);
  CHECK(forced.err.find("pack-trunk") != std::string::npos);
}

TEST_CASE("an interrupted pack-trunk leaves no trunk.json or trunk.bin") {
  TempDir tmp;
  fs::path model = synth(tmp.path / "model", "--size tiny");
  fs::path trunk = tmp.path / "trunk";
  SUBCASE("error mid-way: exit 1, nothing left") {
    Run r = k3flow("pack-trunk " + model.string() + " " + trunk.string(), "K3FLOW_FAIL_AFTER_BYTES=4096");
    CHECK(r.code == 1);
    CHECK(r.err.find("K3FLOW_FAIL_AFTER_BYTES") != std::string::npos);
    CHECK(!fs::exists(trunk / "trunk.json"));
    CHECK(!fs::exists(trunk / "trunk.bin"));
  }
  SUBCASE("killed mid-way: no complete-looking file") {
    Run r = k3flow("pack-trunk " + model.string() + " " + trunk.string(),
                   "K3FLOW_FAIL_AFTER_BYTES=4096 K3FLOW_FAIL_MODE=kill");
    CHECK(r.code == 128 + SIGKILL);
    CHECK(!fs::exists(trunk / "trunk.json"));
    CHECK(!fs::exists(trunk / "trunk.bin"));
    // plan --trunk on the leftovers refuses, naming trunk.json.
    Run p = k3flow("plan " + model.string() + " --trunk " + trunk.string() + " --mem-gb 1");
    CHECK(p.code == 1);
    CHECK(p.err.find("trunk.json") != std::string::npos);
  }
}

TEST_CASE("a trunk packed from another model is refused by plan, naming trunk.json") {
  TempDir tmp;
  fs::path small = synth(tmp.path / "small", "--size tiny --layers 5");
  fs::path model = synth(tmp.path / "model", "--size tiny");
  REQUIRE(k3flow("pack-trunk " + small.string() + " " + (tmp.path / "trunk").string()).code == 0);
  Run r = k3flow("plan " + model.string() + " --trunk " + (tmp.path / "trunk").string() + " --mem-gb 1");
  CHECK(r.code == 1);
  CHECK(r.err.find("trunk.json") != std::string::npos);
  CHECK(r.err.find("layers") != std::string::npos);
  CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
  CHECK(k3flow("pack-trunk " + (tmp.path / "nowhere").string() + " " + (tmp.path / "t2").string()).code != 0);
}
