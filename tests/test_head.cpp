// stages/head: the embedding read a row per id (EmbedRows) gives exactly the floats of the resident
// table (embed_tokens), for the fixture's table and a synthetic BF16 one; the planner's head term
// leaves the table out; a failed row read names the file.
#include <doctest/doctest.h>
#include <fmt/format.h>
#include <simdjson.h>

#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "io/aligned.hpp"
#include "io/config.hpp"
#include "io/error.hpp"
#include "io/file.hpp"
#include "io/safetensors.hpp"
#include "stages/bind.hpp"
#include "stages/head.hpp"
#include "stages/tensors.hpp"
#include "tests/fixture_json.hpp"
#include "tests/run_helpers.hpp"
#include "tests/temp_dir.hpp"

namespace fs = std::filesystem;
using k3::test::TempDir;
using namespace k3;

namespace {

// The whole head bound resident, as the resident model binds it.
struct ResidentHead {
  io::AlignedBuffer bytes;
  std::vector<float> widen;
  stages::HeadWeights w;
  ResidentHead(const io::ShardSet& shards, const io::ModelConfig& c) {
    const stages::Layout lay = stages::locate(stages::model_tensors(c), shards, c);
    bytes = io::AlignedBuffer(lay.buffer_bytes + lay.base_mod8 + 1);
    std::span<std::byte> dst = bytes.bytes().subspan(lay.base_mod8, lay.buffer_bytes);
    stages::read_layout(lay, shards, dst);
    widen.assign(lay.widen_floats, 0.0f);
    w = stages::bind_head(c, lay, dst, widen);
  }
};

void same_rows(const fs::path& model) {
  const io::ModelConfig c = io::load_config(model / "config.json");
  const io::ShardSet shards = io::ShardSet::open(model);
  const ResidentHead resident(shards, c);
  const std::optional<stages::EmbedRows> rows = stages::embed_rows_of(shards, c);
  REQUIRE(rows.has_value());
  const size_t E = size_t(c.hidden);
  const std::vector<int32_t> ids = {0, 1, int32_t(c.vocab / 2), 7, 7, int32_t(c.vocab - 1)};
  std::vector<float> a(ids.size() * E, -1.0f), b(ids.size() * E, -2.0f);
  stages::embed_tokens(resident.w, c, ids, a);
  std::vector<std::byte> row(rows->row_bytes());
  stages::embed_rows(*rows, ids, b, row);
  CHECK(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

}  // namespace

TEST_CASE("embedding rows read per id equal the resident table's, bit for bit") {
  SUBCASE("fixtures/tiny-k3") {
    same_rows(test::fixture_path("tiny-k3"));
  }
  SUBCASE("a synthetic BF16 table") {
    TempDir d;
    const test::Run s = test::k3flow(fmt::format("synth {} --size tiny --seed 3", d / "m"));
    REQUIRE_MESSAGE(s.code == 0, s.err);
    const io::ShardSet shards = io::ShardSet::open(d / "m");
    const std::optional<io::TensorInfo> e = shards.find("language_model.model.embed_tokens.weight");
    REQUIRE(e.has_value());
    CHECK(e->dtype == io::DType::BF16);
    same_rows(fs::path(d / "m"));
  }
}

TEST_CASE("the plan's head term holds lm_head and the vectors, not the embedding table") {
  TempDir d;
  const test::Run s = test::k3flow(fmt::format("synth {} --size tiny --seed 3", d / "m"));
  REQUIRE_MESSAGE(s.code == 0, s.err);
  const io::ShardSet shards = io::ShardSet::open(d / "m");
  const io::ModelConfig c = io::load_config(fs::path(d / "m") / "config.json");
  const stages::Layout all = stages::locate(stages::model_tensors(c), shards, c);
  const uint64_t table = shards.find("language_model.model.embed_tokens.weight")->nbytes;
  const test::Run p = test::k3flow(fmt::format("plan {} --mem-gb 1 --json", d / "m"));
  REQUIRE_MESSAGE(p.code == 0, p.err);
  simdjson::dom::parser parser;
  const simdjson::dom::element plan = parser.parse(p.out);
  bool found = false;
  for (simdjson::dom::element pool : plan["pools"].get_array()) {
    const std::string_view name = pool["name"];
    CHECK_FALSE(name.starts_with("embedding"));
    if (name != "lm_head + head vectors (embedding rows read per id)") continue;
    found = true;
    const uint64_t bytes = uint64_t(pool["bytes"]);
    MESSAGE(fmt::format("head term {} B; the head with the table {} B; the table {} B", bytes,
                        all.buffer_bytes, table));
    CHECK(bytes + table <= all.buffer_bytes + 3 * 4096 + 4 * all.widen_floats);
    CHECK(bytes >= all.buffer_bytes - table);
  }
  CHECK(found);
}

TEST_CASE("a row that cannot be read is an error naming the file") {
  TempDir d;
  const fs::path f = d / "short.bin";
  {
    std::FILE* out = std::fopen(f.c_str(), "wb");
    REQUIRE(out != nullptr);
    const std::vector<char> zeros(4096, 0);
    std::fwrite(zeros.data(), 1, zeros.size(), out);
    std::fclose(out);
  }
  const io::File file = io::File::open_read(f, io::File::Mode::buffered);
  const stages::EmbedRows rows{.file = &file, .offset = 0, .dtype = io::DType::BF16, .hidden = 1024};
  std::vector<float> out(1024);
  std::vector<std::byte> row(rows.row_bytes());
  const std::vector<int32_t> fits = {1}, past = {2};  // row 1 is bytes 2048..4095; row 2 is past the end
  stages::embed_rows(rows, fits, out, row);
  CHECK(out[0] == 0.0f);
  try {
    stages::embed_rows(rows, past, out, row);
    FAIL("a row past the end of the file was read");
  } catch (const io::Error& e) {
    CHECK(std::string(e.what()).find("short.bin") != std::string::npos);
  }
}
