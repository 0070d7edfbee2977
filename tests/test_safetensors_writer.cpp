// io/safetensors_writer.*: header layout, byte-exact data, partial-then-rename, sparse shards.
#include <doctest/doctest.h>
#include <simdjson.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "io/aligned.hpp"
#include "io/error.hpp"
#include "io/safetensors.hpp"
#include "io/safetensors_writer.hpp"
#include "tests/temp_dir.hpp"

namespace fs = std::filesystem;
using k3::io::DType;
using k3::io::SafetensorsWriter;
using k3::io::TensorEntry;
using k3::test::TempDir;

namespace {

std::vector<TensorEntry> sample_tensors() {
  return {
      {"a.f32", DType::F32, {3, 5}},
      {"b.bf16", DType::BF16, {7}},
      {"weird \"name\"\\x", DType::U8, {2, 3, 1, 1}},
      {"scalar", DType::F16, {}},
      {"empty", DType::F32, {0, 8}},
  };
}

std::string slurp(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), {}};
}

std::vector<std::byte> pattern(size_t n, unsigned seed) {
  std::vector<std::byte> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = std::byte((i * 131 + seed) & 0xFF);
  return v;
}

}  // namespace

TEST_CASE("layout: compact header, 8-byte aligned data, back-to-back offsets") {
  auto tensors = sample_tensors();
  auto l = k3::io::layout_shard(tensors, {{"format", "pt"}});
  CHECK(l.header.size() % 8 == 0);
  CHECK(l.data_start() % 8 == 0);
  CHECK(l.header.front() == '{');
  CHECK(l.data_bytes == 60 + 14 + 6 + 2 + 0);
  CHECK(l.offsets == std::vector<uint64_t>{0, 60, 74, 80, 82});

  simdjson::dom::parser parser;
  simdjson::padded_string json(l.header);
  simdjson::dom::object root = parser.parse(json).get_object();
  CHECK(std::string_view(root["__metadata__"]["format"].get_string()) == "pt");
  simdjson::dom::object w = root["weird \"name\"\\x"].get_object();
  CHECK(std::string_view(w["dtype"].get_string()) == "U8");
  simdjson::dom::array shape = w["shape"].get_array();
  CHECK(shape.size() == 4);
  simdjson::dom::array off = w["data_offsets"].get_array();
  CHECK(uint64_t(off.at(0)) == 74);
  CHECK(uint64_t(off.at(1)) == 80);
  CHECK(root["scalar"]["shape"].get_array().size() == 0);
  CHECK(std::string_view(root["b.bf16"]["dtype"].get_string()) == "BF16");
}

TEST_CASE("layout refuses duplicate names and rank > 4") {
  std::vector<TensorEntry> dup = {{"x", DType::U8, {1}}, {"x", DType::U8, {2}}};
  CHECK_THROWS_AS(k3::io::layout_shard(dup, {}), k3::io::Error);
  std::vector<TensorEntry> deep = {{"x", DType::U8, {1, 1, 1, 1, 1}}};
  CHECK_THROWS_AS(k3::io::layout_shard(deep, {}), k3::io::Error);
}

TEST_CASE("write, finish, commit: bytes land exactly, partial name until commit") {
  TempDir dir;
  const fs::path final_path = dir.path / "model-00001-of-000001.safetensors";
  SafetensorsWriter w(final_path, sample_tensors());
  const uint64_t n = w.layout().data_bytes;
  auto data = pattern(n, 7);
  w.append(std::span(data).first(10));
  w.append(std::span(data).subspan(10));  // crosses tensor boundaries
  CHECK(fs::exists(k3::io::partial_path(final_path)));
  CHECK_FALSE(fs::exists(final_path));
  w.finish();
  CHECK_FALSE(fs::exists(final_path));
  w.commit();
  CHECK(fs::exists(final_path));
  CHECK_FALSE(fs::exists(k3::io::partial_path(final_path)));

  std::string bytes = slurp(final_path);
  REQUIRE(bytes.size() == w.layout().file_size());
  uint64_t hlen = 0;
  for (int i = 0; i < 8; ++i) hlen |= uint64_t(uint8_t(bytes[i])) << (8 * i);
  CHECK(hlen == w.layout().header.size());
  CHECK(bytes.substr(8, hlen) == w.layout().header);
  CHECK(std::memcmp(bytes.data() + 8 + hlen, data.data(), n) == 0);
}

TEST_CASE("the shard reader indexes what the writer wrote") {
  TempDir dir;
  const fs::path final_path = dir.path / "model-00001-of-000001.safetensors";
  {
    SafetensorsWriter w(final_path, sample_tensors());
    auto data = pattern(w.layout().data_bytes, 3);
    w.append(data);
    w.finish();
    w.commit();
  }
  auto set = k3::io::ShardSet::open(dir.path);
  CHECK(set.tensor_count() == 5);
  auto a = set.find("a.f32");
  REQUIRE(a.has_value());
  CHECK(a->dtype == DType::F32);
  CHECK(a->rank == 2);
  CHECK(a->shape[0] == 3);
  CHECK(a->shape[1] == 5);
  CHECK(a->nbytes == 60);
  auto w = set.find("weird \"name\"\\x");
  REQUIRE(w.has_value());
  std::vector<std::byte> got(w->nbytes);
  set.read(*w, got);
  auto want = pattern(82, 3);
  CHECK(std::memcmp(got.data(), want.data() + 74, 6) == 0);
}

TEST_CASE("an unfinished or uncommitted writer leaves nothing behind") {
  TempDir dir;
  const fs::path p = dir.path / "x.safetensors";
  {
    SafetensorsWriter w(p, sample_tensors());
    w.append(pattern(5, 1));
  }
  CHECK(fs::is_empty(dir.path));
  {
    SafetensorsWriter w(p, sample_tensors());
    w.append(pattern(w.layout().data_bytes, 1));
    w.finish();
  }
  CHECK(fs::is_empty(dir.path));
}

TEST_CASE("misuse is refused") {
  TempDir dir;
  const fs::path p = dir.path / "x.safetensors";
  SafetensorsWriter w(p, sample_tensors());
  CHECK_THROWS_AS(w.append(pattern(w.layout().data_bytes + 1, 0)), k3::io::Error);
  w.append(pattern(4, 0));
  CHECK_THROWS_AS(w.finish(), k3::io::Error);                              // short
  CHECK_THROWS_AS(w.commit(), k3::io::Error);                              // not finished
  CHECK_THROWS_AS(SafetensorsWriter(p, sample_tensors()), k3::io::Error);  // partial exists
}

TEST_CASE("an unwritable directory is named in the error") {
  try {
    SafetensorsWriter w("/proc/definitely/not/here.safetensors", sample_tensors());
    FAIL("expected an error");
  } catch (const k3::io::Error& e) {
    CHECK(std::string(e.what()).find("/proc/definitely/not/here.safetensors.partial") != std::string::npos);
    CHECK(e.kind() == k3::io::ErrorKind::runtime);
  }
}

TEST_CASE("sparse finish: full logical size, header bytes only on disk") {
  TempDir dir;
  const fs::path p = dir.path / "big.safetensors";
  std::vector<TensorEntry> t = {{"huge", DType::BF16, {1u << 20, 4096}}};  // 8 GiB logical
  SafetensorsWriter w(p, t);
  w.finish_sparse();
  w.commit();
  struct stat st {};
  REQUIRE(::stat(p.c_str(), &st) == 0);
  CHECK(uint64_t(st.st_size) == w.layout().file_size());
  CHECK(uint64_t(st.st_blocks) * 512 < (1u << 20));
}

namespace {

// Writes a multi-stage shard in awkward pieces (tiny, odd, aligned and not) and checks every byte.
void write_in_pieces(const fs::path& dir, SafetensorsWriter::Mode mode) {
  const fs::path p = dir / "pieces.safetensors";
  std::vector<TensorEntry> t = {
      {"a", DType::U8, {13}}, {"b", DType::BF16, {5u << 20}}, {"c", DType::U8, {4099}}};
  SafetensorsWriter w(p, t, {}, mode);
  if (mode == SafetensorsWriter::Mode::buffered) CHECK_FALSE(w.direct());
  const uint64_t n = w.layout().data_bytes;
  auto want = pattern(n, 11);
  k3::io::AlignedBuffer aligned(4u << 20);
  uint64_t pos = 0;
  auto put = [&](uint64_t len, bool from_aligned) {
    len = std::min(len, n - pos);
    if (from_aligned) {
      std::memcpy(aligned.data(), want.data() + pos, len);
      w.append({aligned.data(), len});
    } else {
      w.append(std::span(want).subspan(pos, len));
    }
    pos += len;
  };
  put(13, false);
  put(4096 * 3, true);
  put(5, false);
  put(4u << 20, true);
  put((4u << 20) - 7, true);
  put(1, false);
  while (pos < n) put(3u << 20, true);
  w.finish();
  w.commit();
  std::string bytes = slurp(p);
  REQUIRE(bytes.size() == w.layout().file_size());
  CHECK(bytes.substr(8, w.layout().header.size()) == w.layout().header);
  CHECK(std::memcmp(bytes.data() + w.layout().data_start(), want.data(), n) == 0);
}

}  // namespace

TEST_CASE("pieces of any size and alignment land exactly (direct, staged and buffered paths)") {
  TempDir dir;
  SUBCASE("direct preferred") {
    write_in_pieces(dir.path, SafetensorsWriter::Mode::direct_preferred);
  }
  SUBCASE("buffered") {
    write_in_pieces(dir.path, SafetensorsWriter::Mode::buffered);
  }
  SUBCASE("tmpfs, where O_DIRECT may be refused") {
    if (!fs::is_directory("/dev/shm")) {
      MESSAGE("no /dev/shm here: the tmpfs case is skipped");
      return;
    }
    std::string tmpl = "/dev/shm/k3_stw_XXXXXX";
    REQUIRE(::mkdtemp(tmpl.data()) != nullptr);
    write_in_pieces(tmpl, SafetensorsWriter::Mode::direct_preferred);
    fs::remove_all(tmpl);
  }
}

TEST_CASE("a sparse shard's header reads back and its data region reads as zeros") {
  TempDir dir;
  const fs::path p = dir.path / "s.safetensors";
  std::vector<TensorEntry> t = {{"x", DType::F32, {1000}}, {"y", DType::U8, {3}}};
  SafetensorsWriter w(p, t, {});
  w.finish_sparse();
  w.commit();
  std::string bytes = slurp(p);
  REQUIRE(bytes.size() == w.layout().file_size());
  CHECK(bytes.substr(8, w.layout().header.size()) == w.layout().header);
  CHECK(bytes.find_first_not_of('\0', w.layout().data_start()) == std::string::npos);
}
