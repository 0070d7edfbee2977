// `k3flow inspect`: reports exactly what synth wrote, the released model's figures on the sparse
// replica (with under 1 GB of real disk), and refuses broken checkpoints naming the file.
#include <doctest/doctest.h>
#include <fmt/format.h>
#include <simdjson.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "tests/run_helpers.hpp"
#include "tests/sparse_replica.hpp"

namespace fs = std::filesystem;

namespace {

using k3::test::Run;
using k3::test::slurp;
using k3::test::TempDir;

// `k3flow ARGS` (shell words), stdout and stderr captured apart.
Run k3flow(const std::string& args) {
  return k3::test::k3flow_sh(args);
}

uint64_t disk_bytes(const fs::path& dir) {
  uint64_t n = 0;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    struct stat st {};
    if (::lstat(e.path().c_str(), &st) == 0) n += uint64_t(st.st_blocks) * 512;
  }
  return n;
}

int64_t get_int(simdjson::dom::element doc, const char* key) {
  int64_t v = 0;
  REQUIRE_MESSAGE(doc[key].get(v) == simdjson::SUCCESS, key);
  return v;
}

}  // namespace

TEST_CASE("inspect reports exactly the dims synth wrote") {
  TempDir dir;
  const fs::path out = dir.path / "m";
  Run s = k3flow(fmt::format(
      "synth {} --layers 9 --hidden 64 --vocab 200 --heads 2 --head-dim 8 --mla-heads 2 --q-lora 32 "
      "--kv-lora 16 "
      "--qk-nope 8 --qk-rope 8 --v-head 8 --experts 20 --top-k 4 --shared 1 --latent 32 --moe-inter 64 "
      "--dense-inter 48 --block-size 3 --full-attn 4,8,9 --first-dense 2 --shards 3",
      out.string()));
  REQUIRE_MESSAGE(s.code == 0, s.err);
  Run r = k3flow(fmt::format("inspect {} --json", out.string()));
  REQUIRE_MESSAGE(r.code == 0, r.err);
  simdjson::dom::parser parser;
  simdjson::padded_string json(r.out);
  simdjson::dom::element doc = parser.parse(json);
  CHECK(get_int(doc, "layers") == 9);
  CHECK(get_int(doc, "kda_layers") == 6);
  CHECK(get_int(doc, "mla_layers") == 3);
  CHECK(get_int(doc, "dense_layers") == 2);
  CHECK(get_int(doc, "moe_layers") == 7);
  CHECK(std::string_view(doc["layer_map"].get_string()) == "KKKMKKKMM");
  CHECK(get_int(doc, "hidden") == 64);
  CHECK(get_int(doc, "vocab") == 200);
  CHECK(get_int(doc, "experts") == 20);
  CHECK(get_int(doc, "top_k") == 4);
  CHECK(get_int(doc, "shards") == 3);
  const int64_t expert_bytes = 3 * 64 * 32 / 2 + 3 * 64 * 32 / 32;
  CHECK(get_int(doc, "expert_bytes") == expert_bytes);
  CHECK(get_int(doc, "expert_bytes_min") == expert_bytes);
  CHECK(get_int(doc, "expert_bytes_max") == expert_bytes);
  CHECK(get_int(doc, "expert_blobs") == 7 * 20);
  CHECK(get_int(doc, "experts_contiguous") == 7 * 20);
  CHECK(get_int(doc, "trunk_layers_contiguous") == 9);
  // Trunk tensors: 6 per layer + KDA 14 / MLA 8 + dense 3 / MoE 8; experts 6 each; 5 model-level.
  const int64_t tensors = 9 * 6 + 6 * 14 + 3 * 8 + 2 * 3 + 7 * 8 + 7 * 20 * 6 + 5;
  CHECK(get_int(doc, "tensors") == tensors);
  int64_t file_bytes = 0;
  for (const auto& e : fs::directory_iterator(out))
    if (e.path().extension() == ".safetensors") file_bytes += int64_t(fs::file_size(e.path()));
  CHECK(get_int(doc, "total_bytes") == file_bytes);
  CHECK(get_int(doc, "resident_bytes") == 2 * 200 * 64 * 2 + 2 * 64 * 2 + 64 * 2);
  CHECK(doc["problems"].get_array().size() == 0);
  CHECK(get_int(doc["roles"]["expert"], "tensors") == 7 * 20 * 6);
  CHECK(get_int(doc["roles"]["other"], "tensors") == 0);
  CHECK(get_int(doc["dtypes"]["U8"], "tensors") == 7 * 20 * 6);
  CHECK(doc["trunk_bytes_per_layer"].get_array().size() == 9);
  double per_tensor = 0;
  REQUIRE(doc["index_bytes_per_tensor"].get(per_tensor) == simdjson::SUCCESS);
  CHECK(per_tensor > 0);

  Run text = k3flow(fmt::format("inspect {}", out.string()));
  REQUIRE(text.code == 0);
  CHECK(text.out.find("KKKMKKKMM") != std::string::npos);
  CHECK(text.out.find("resident") != std::string::npos);
  CHECK(text.out.find("problem") == std::string::npos);
}

TEST_CASE("inspect reads the tiny oracle fixture in the released layout") {
  Run r = k3flow(fmt::format("inspect {}/tiny-k3 --json", K3_FIXTURES));
  REQUIRE_MESSAGE(r.code == 0, r.err);
  simdjson::dom::parser parser;
  simdjson::padded_string json(r.out);
  simdjson::dom::element doc = parser.parse(json);
  CHECK(get_int(doc, "layers") == 13);
  CHECK(get_int(doc, "kda_layers") == 9);
  CHECK(get_int(doc, "mla_layers") == 4);
  CHECK(std::string_view(doc["layer_map"].get_string()) == "KKKMKKKMKKKMM");
  CHECK(get_int(doc, "tensors") == 628);
}

TEST_CASE("broken checkpoints: one line naming the file, exit 1 (a path that is no checkpoint: 2)") {
  TempDir dir;
  const fs::path m = dir.path / "m";
  REQUIRE(k3flow(fmt::format("synth {} --size tiny", m.string())).code == 0);

  // MODEL_DIR that does not exist, or holds no config.json, is a usage error naming it.
  Run none = k3flow(fmt::format("inspect {}", (dir.path / "absent").string()));
  CHECK(none.code == 2);
  CHECK(none.err == fmt::format("k3flow: MODEL_DIR {}: does not exist\n", (dir.path / "absent").string()));

  SUBCASE("missing config") {
    fs::remove(m / "config.json");
    Run r = k3flow(fmt::format("inspect {} --json", m.string()));
    CHECK(r.code == 2);
    CHECK_MESSAGE(r.err.find("config.json") != std::string::npos, r.err);
    CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
    CHECK(r.out.empty());
  }
  SUBCASE("malformed config") {
    std::ofstream(m / "config.json") << "{\"text_config\": {\"hidden_size\": ";
    Run r = k3flow(fmt::format("inspect {}", m.string()));
    CHECK(r.code == 1);
    CHECK_MESSAGE(r.err.find("config.json") != std::string::npos, r.err);
    CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
  }
  SUBCASE("truncated shard") {
    const fs::path shard = m / "model-00002-of-000005.safetensors";
    fs::resize_file(shard, fs::file_size(shard) / 2);
    Run r = k3flow(fmt::format("inspect {}", m.string()));
    CHECK(r.code == 1);
    CHECK_MESSAGE(r.err.find("model-00002-of-000005.safetensors") != std::string::npos, r.err);
    CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
  }
  SUBCASE("garbage header") {
    const fs::path shard = m / "model-00003-of-000005.safetensors";
    std::fstream f(shard, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(8);
    f << "#garbage";
    f.close();
    Run r = k3flow(fmt::format("inspect {}", m.string()));
    CHECK(r.code == 1);
    CHECK_MESSAGE(r.err.find("model-00003-of-000005.safetensors") != std::string::npos, r.err);
  }
}

TEST_CASE("synth --sparse is a full-scale replica: inspect reports the released figures, < 1 GB on disk") {
  // The replica ctest's replica_synth fixture made (or this binary's own: tests/sparse_replica.hpp).
  const fs::path out = k3::test::sparse_replica();
  const auto t0 = std::chrono::steady_clock::now();
  Run r = k3flow(fmt::format("inspect {} --json", out.string()));
  REQUIRE_MESSAGE(r.code == 0, r.err);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  MESSAGE("inspect of the sparse replica: ", secs, " s; inspect --json:\n", r.out);

  simdjson::dom::parser parser;
  simdjson::padded_string json(r.out);
  simdjson::dom::element doc = parser.parse(json);
  CHECK(get_int(doc, "tensors") == 497220);
  CHECK(get_int(doc, "shards") == 96);
  CHECK(get_int(doc, "layers") == 93);
  CHECK(get_int(doc, "kda_layers") == 69);
  CHECK(get_int(doc, "mla_layers") == 24);
  CHECK(get_int(doc, "experts") == 896);
  CHECK(get_int(doc, "top_k") == 16);
  CHECK(get_int(doc, "expert_bytes") == 17547264);
  CHECK(get_int(doc, "expert_bytes_min") == 17547264);
  CHECK(get_int(doc, "expert_bytes_max") == 17547264);
  CHECK(get_int(doc, "expert_blobs") == 82432);
  CHECK(get_int(doc, "experts_contiguous") == 82432);
  CHECK(get_int(doc, "trunk_layers_contiguous") == 93);
  CHECK(get_int(doc["roles"]["expert"], "bytes") == 1446456066048);
  // embed + lm_head (bf16) + final norm + output AttnRes pair (three 7168-vectors, bf16 or f32)
  const int64_t resident = get_int(doc, "resident_bytes");
  CHECK(resident >= 2 * 2348810240ll + 3 * 7168 * 2);
  CHECK(resident <= 2 * 2348810240ll + 3 * 7168 * 4);
  const double total = double(get_int(doc, "total_bytes"));
  CHECK(std::fabs(total - 1560936091448.0) / 1560936091448.0 < 0.001);
  double per_tensor = 0;
  REQUIRE(doc["index_bytes_per_tensor"].get(per_tensor) == simdjson::SUCCESS);
  CHECK(per_tensor <= 100.0);
  CHECK(doc["problems"].get_array().size() == 0);

  const uint64_t used = disk_bytes(out);
  MESSAGE("sparse replica: ", used, " bytes on disk for ", uint64_t(total), " logical");
  CHECK(used < 1000000000ull);
  // The seconds are reported, not asserted: a unit test on a shared 2-core host is no stopwatch
  // (under ASan with a build beside it they were 70).
}
