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
using k3::test::TempDir;

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
  TempDir tmp(fs::current_path(), "k3_pack_cli_");  // the build directory: real disk
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

  // The plan from the shards counts the slots a run from the shards reads into (each layer's enclosing
  // 4096-aligned window); the packed trunk holds the same bytes without the windows' edges: no more,
  // and at most two pages per layer less.
  simdjson::dom::parser p1, p2;
  Run a = k3flow("plan " + model.string() + " --mem-gb 1 --json");
  Run b = k3flow("plan " + model.string() + " --trunk " + trunk.string() + " --mem-gb 1 --json");
  REQUIRE_MESSAGE(a.code == 0, a.err);
  REQUIRE_MESSAGE(b.code == 0, b.err);
  simdjson::dom::element ja = p1.parse(a.out), jb = p2.parse(b.out);
  const uint64_t from_shards = uint64_t(ja["trunk"]["trunk_bytes"]),
                 packed = uint64_t(jb["trunk"]["trunk_bytes"]);
  CHECK(packed <= from_shards);
  CHECK(from_shards - packed <= uint64_t(c.n_layers) * 2 * 4096);
  CHECK(std::string_view(jb["source"]).find(trunk.string()) != std::string_view::npos);

  Run forced = k3flow("pack-trunk " + model.string() + " " + (tmp.path / "trunk2").string() + " --progress");
  REQUIRE(forced.code == 0);
  CHECK(forced.err.find("pack-trunk") != std::string::npos);
}

TEST_CASE("an interrupted pack-trunk leaves no trunk.json or trunk.bin") {
  TempDir tmp(fs::current_path(), "k3_pack_cli_");  // the build directory: real disk
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
    // plan --trunk on the leftovers refuses: a directory without trunk.json is no packed trunk (usage).
    Run p = k3flow("plan " + model.string() + " --trunk " + trunk.string() + " --mem-gb 1");
    CHECK(p.code == 2);
    CHECK(p.err.find("--trunk " + trunk.string() + ": no trunk.json") != std::string::npos);
  }
}

TEST_CASE("a trunk packed from another model is refused by plan, naming trunk.json") {
  TempDir tmp(fs::current_path(), "k3_pack_cli_");  // the build directory: real disk
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

namespace {

std::string gen_with(const fs::path& model, const fs::path& trunk) {
  return "generate " + model.string() + " --ids 1,2 --gen 2 --mem-gb 0.02 --trunk " + trunk.string();
}

bool one_line(const std::string& s) {
  return std::count(s.begin(), s.end(), '\n') == 1;
}

// trunk.json's text with `from` replaced by `to` once (REQUIREs that it occurs).
void edit_json(const fs::path& trunk, const std::string& from, const std::string& to) {
  std::string text = slurp(trunk / "trunk.json");
  const size_t at = text.find(from);
  REQUIRE_MESSAGE(at != std::string::npos, from);
  text.replace(at, from.size(), to);
  std::ofstream(trunk / "trunk.json", std::ios::binary | std::ios::trunc) << text;
}

}  // namespace

TEST_CASE("a trunk packed from another checkpoint with the same layer count is refused by generate") {
  TempDir tmp(fs::current_path(), "k3_pack_cli_");  // the build directory: real disk
  fs::path a = synth(tmp.path / "a", "--size tiny --seed 1");
  fs::path b = synth(tmp.path / "b", "--size tiny --seed 2");  // same shapes, other bytes
  fs::path c = synth(tmp.path / "c", "--size tiny --seed 1 --shards 2");
  fs::path trunk = tmp.path / "trunk";
  REQUIRE(k3flow("pack-trunk " + a.string() + " " + trunk.string()).code == 0);
  Run ok = k3flow(gen_with(a, trunk));
  REQUIRE_MESSAGE(ok.code == 0, ok.err);

  for (const fs::path& other : {b, c}) {
    CAPTURE(other);
    Run r = k3flow(gen_with(other, trunk));
    CHECK(r.code == 1);
    CHECK(r.err.find(trunk.string()) != std::string::npos);
    CHECK(r.err.find("pack-trunk") != std::string::npos);
    CHECK(one_line(r.err));
  }
  // What differs is named.
  CHECK(k3flow(gen_with(b, trunk)).err.find("layer 0: tensor bytes differ") != std::string::npos);
  CHECK(k3flow(gen_with(c, trunk)).err.find("shards") != std::string::npos);

  SUBCASE("a trunk.json without the source fingerprint (older pack-trunk) is refused: re-run pack-trunk") {
    std::string text = slurp(trunk / "trunk.json");
    const size_t s = text.find(",\n\"source\":");
    REQUIRE(s != std::string::npos);
    const size_t e = text.find(",\"layers\":", s);
    REQUIRE(e != std::string::npos);
    text.erase(s, e - s);
    std::ofstream(trunk / "trunk.json", std::ios::binary | std::ios::trunc) << text;
    Run old = k3flow(gen_with(a, trunk));
    CHECK(old.code == 1);
    CHECK(old.err.find("re-run") != std::string::npos);
    CHECK(old.err.find("pack-trunk") != std::string::npos);
    CHECK(one_line(old.err));
  }
}

TEST_CASE(
    "generate verifies each trunk layer's xxh64 when it is read; trunk.json offsets are bound-checked") {
  TempDir tmp(fs::current_path(), "k3_pack_cli_");  // the build directory: real disk
  fs::path model = synth(tmp.path / "model", "--size tiny");
  fs::path trunk = tmp.path / "trunk";
  REQUIRE(k3flow("pack-trunk " + model.string() + " " + trunk.string()).code == 0);
  k3::io::ModelConfig cfg = k3::io::load_config(model / "config.json");
  std::vector<k3::io::TrunkLayer> layers = k3::io::PackedTrunk::open(trunk, cfg.n_layers).layers();
  REQUIRE(layers.size() >= 2);

  SUBCASE("one flipped byte in layer 1") {
    {
      std::fstream f(trunk / "trunk.bin", std::ios::in | std::ios::out | std::ios::binary);
      f.seekg(std::streamoff(layers[1].file_off + layers[1].tensors[0].off + 3));
      char ch = 0;
      f.read(&ch, 1);
      ch = char(ch ^ 0x10);
      f.seekp(std::streamoff(layers[1].file_off + layers[1].tensors[0].off + 3));
      f.write(&ch, 1);
    }
    Run r = k3flow(gen_with(model, trunk));
    CHECK(r.code == 1);
    CHECK(r.err.find("trunk.bin") != std::string::npos);
    CHECK(r.err.find("layer 1") != std::string::npos);
    CHECK(one_line(r.err));
  }
  SUBCASE("two layers of the same size swap their file offsets") {
    size_t x = 0, y = 0;
    for (size_t i = 0; i < layers.size() && !y; ++i)
      for (size_t k = i + 1; k < layers.size() && !y; ++k)
        if (layers[i].nbytes == layers[k].nbytes) x = i, y = k;
    REQUIRE(y > 0);
    auto key = [](size_t l, const std::string& off) {
      return "\"layer\":" + std::to_string(l) + ",\"file_off\":" + off + ",";
    };
    const std::string ox = std::to_string(layers[x].file_off), oy = std::to_string(layers[y].file_off);
    edit_json(trunk, key(x, ox), key(x, oy));
    edit_json(trunk, key(y, oy), key(y, ox));
    Run r = k3flow(gen_with(model, trunk));
    CHECK(r.code == 1);
    CHECK(r.err.find("checksum") != std::string::npos);
    CHECK((r.err.find("layer " + std::to_string(x)) != std::string::npos ||  // whichever lands first
           r.err.find("layer " + std::to_string(y)) != std::string::npos));
    CHECK(one_line(r.err));
  }
  SUBCASE("file_off + nbytes wraps around 2^64") {
    // 2^64 - 4096 + nbytes wraps to nbytes - 4096, inside trunk.bin: accepted before the fix.
    const std::string last = "\"layer\":" + std::to_string(layers.size() - 1) +
                             ",\"file_off\":" + std::to_string(layers.back().file_off) + ",";
    edit_json(trunk, last,
              "\"layer\":" + std::to_string(layers.size() - 1) + ",\"file_off\":18446744073709547520,");
    Run r = k3flow("plan " + model.string() + " --trunk " + trunk.string() + " --mem-gb 1");
    CHECK(r.code == 1);
    CHECK(r.err.find("trunk.json") != std::string::npos);
    CHECK(one_line(r.err));
  }
}

TEST_CASE("pack-trunk: SIGINT / SIGTERM remove the temporaries and the directory it created; --force") {
  TempDir tmp(fs::current_path(), "k3_pack_cli_");  // the build directory: real disk
  fs::path model = synth(tmp.path / "model", "--size tiny");
  for (const char* sig : {"INT", "TERM"}) {
    CAPTURE(sig);
    fs::path trunk = tmp.path / (std::string("trunk_") + sig);
    // The test hook holds the pack after its first chunk until a signal arrives.
    const std::string cmd = "K3FLOW_FAIL_AFTER_BYTES=1 K3FLOW_FAIL_MODE=wait " + std::string(K3FLOW_BIN) +
                            " pack-trunk " + model.string() + " " + trunk.string() +
                            " & pid=$!; i=0; while [ ! -e " + (trunk / "trunk.bin.partial").string() +
                            " ] && [ $i -lt 500 ]; do sleep 0.02; i=$((i+1)); done; sleep 0.1; kill -" + sig +
                            " $pid; wait $pid";
    const k3::test::Run r = k3::test::shell(cmd, 60);
    CHECK(r.code == (std::string(sig) == "INT" ? 130 : 143));
    CHECK(r.err.find("interrupted") != std::string::npos);
    CHECK(one_line(r.err));
    CHECK(!fs::exists(trunk));
  }

  fs::path trunk = tmp.path / "trunk";
  SUBCASE("a failed pack removes the directory it created, not one that existed") {
    Run r = k3flow("pack-trunk " + model.string() + " " + trunk.string(), "K3FLOW_FAIL_AFTER_BYTES=4096");
    CHECK(r.code == 1);
    CHECK(!fs::exists(trunk));
    fs::create_directories(trunk);
    r = k3flow("pack-trunk " + model.string() + " " + trunk.string(), "K3FLOW_FAIL_AFTER_BYTES=4096");
    CHECK(r.code == 1);
    CHECK(fs::is_directory(trunk));
    CHECK(fs::is_empty(trunk));
  }
  SUBCASE("packing into an existing trunk needs --force") {
    REQUIRE(k3flow("pack-trunk " + model.string() + " " + trunk.string()).code == 0);
    const std::string json = slurp(trunk / "trunk.json");
    Run r = k3flow("pack-trunk " + model.string() + " " + trunk.string());
    CHECK(r.code == 1);
    CHECK(r.err.find("--force") != std::string::npos);
    CHECK(r.err.find(trunk.string()) != std::string::npos);
    CHECK(slurp(trunk / "trunk.json") == json);
    r = k3flow("pack-trunk " + model.string() + " " + trunk.string() + " --force");
    CHECK_MESSAGE(r.code == 0, r.err);
  }
}

TEST_CASE(
    "pack-trunk --codec exp4|huff: smaller trunk.bin, decoded bytes = the raw pack's, generate streams it") {
  TempDir tmp(fs::current_path(), "k3_pack_cli_");  // the build directory: real disk
  fs::path model = synth(tmp.path / "model", "--size tiny");
  const fs::path raw = tmp.path / "raw";
  REQUIRE(k3flow("pack-trunk " + model.string() + " " + raw.string()).code == 0);
  const k3::io::ModelConfig c = k3::io::load_config(model / "config.json");
  const k3::io::PackedTrunk plain = k3::io::PackedTrunk::open(raw, c.n_layers);
  CHECK(plain.codec() == k3::io::codec::Codec::none);
  for (const std::string codec : {"exp4", "huff"}) {
    CAPTURE(codec);
    const fs::path trunk = tmp.path / codec;
    Run r = k3flow("pack-trunk " + model.string() + " " + trunk.string() + " --codec " + codec + " --verify");
    REQUIRE_MESSAGE(r.code == 0, r.err);
    CHECK(r.out.find("codec " + codec + ":") != std::string::npos);
    CHECK(r.out.find("verified") != std::string::npos);
    CHECK(slurp(trunk / "trunk.json").find("\"codec\":\"" + codec + "\"") != std::string::npos);
    const k3::io::PackedTrunk t = k3::io::PackedTrunk::open(trunk, c.n_layers);
    CHECK(k3::io::codec::codec_name(t.codec()) == codec);
    CHECK(fs::file_size(trunk / "trunk.bin") < fs::file_size(raw / "trunk.bin") * 4 / 5);
    for (const auto& L : t.layers()) {
      CAPTURE(L.layer);
      const auto& P = plain.layer(L.layer);
      CHECK(L.nbytes == P.nbytes);
      CHECK(L.xxh64 == P.xxh64);  // of the decoded bytes: the raw pack's bytes
      std::vector<std::byte> stored(L.stored_bytes), out(L.nbytes), want(P.nbytes);
      t.file().read_exact(L.file_off, stored);
      plain.file().read_exact(P.file_off, want);
      t.decode_layer(L.layer, stored, out);
      CHECK(out == want);
    }
    // generate streams it through the graph's decode stage (tests/test_codec_stream.cpp checks the bits)
    Run g = k3flow(gen_with(model, trunk));
    CHECK_MESSAGE(g.code == 0, g.err);
  }
  CHECK(k3flow("pack-trunk " + model.string() + " " + (tmp.path / "x").string() + " --codec zstd").code == 2);
}
