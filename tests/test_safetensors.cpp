// safetensors shard set: the fixtures/st/ checks of docs/model.md §6.6, the cache fixture, shard lists
// from model.safetensors.index.json, and every refusal (each writes its own malformed shard and
// asserts the one-line message names the file and the tensor).
#include <doctest/doctest.h>
#include <unistd.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "io/error.hpp"
#include "io/file.hpp"
#include "io/safetensors.hpp"
#include "io/widen.hpp"
#include "tests/temp_dir.hpp"

using namespace k3::io;
namespace fs = std::filesystem;
using k3::test::TempDir;

namespace {

const fs::path kSt = fs::path(K3_FIXTURES) / "st";
const std::string kShard1 = (kSt / "model-00001-of-00002.safetensors").string();
const std::string kShard2 = (kSt / "model-00002-of-00002.safetensors").string();
const std::string kDeep = "language_model.model.layers.0.block_sparse_moe.experts.";
const std::string kWeird = "weird\\name.\"with\"quotes";

struct Expect {
  std::string name;
  DType dtype;
  std::vector<uint64_t> shape;
  uint32_t shard;
  uint64_t start, end;  // data_offsets
};

// Data starts: shard 1 at 8 + 1022, shard 2 at 8 + 253.
const uint64_t kDataStart[2] = {1030, 261};

const std::vector<Expect> kExpect = {
    {"plain.f32.2d", DType::F32, {16, 16}, 0, 0, 1024},
    {"plain.bf16.1d", DType::BF16, {128}, 0, 1024, 1280},
    {"tricky.f16.1d", DType::F16, {64}, 0, 1280, 1408},
    {"packed.u8.2d", DType::U8, {7, 32}, 0, 1408, 1632},
    {"scalar.f32", DType::F32, {}, 0, 1632, 1636},
    {"empty.f32", DType::F32, {0, 8}, 0, 1636, 1636},
    {kDeep + "0.w1.weight_packed", DType::U8, {2, 32}, 0, 1636, 1700},
    {kDeep + "1.w1.weight_packed", DType::U8, {2, 32}, 0, 1700, 1764},
    {"rank3.f32", DType::F32, {2, 3, 4}, 0, 1764, 1860},
    {"rank4.u8", DType::U8, {2, 2, 2, 2}, 0, 1860, 1876},
    {"second.shard.f32", DType::F32, {10, 10}, 1, 0, 400},
    {"second.shard.u8", DType::U8, {300}, 1, 400, 700},
    {kWeird, DType::F32, {3}, 1, 700, 712},
};

// Widened f32 bit patterns at listed indices (computed independently from the fixture bytes).
const std::map<std::string, std::vector<std::pair<size_t, uint32_t>>> kBits = {
    {"plain.f32.2d", {{0, 0x3b71dba5}, {17, 0xbfafb976}, {100, 0xbf69d697}, {255, 0xc0349d48}}},
    {"plain.bf16.1d",
     {{0, 0x7f800000},
      {1, 0xff800000},
      {2, 0x7fc00000},
      {3, 0x00000000},
      {4, 0x80000000},
      {5, 0x00800000},
      {6, 0xd3ab0000},
      {127, 0x2f2c0000}}},
    {"tricky.f16.1d",
     {{0, 0x7f800000},
      {1, 0xff800000},
      {2, 0x7fc00000},
      {3, 0x00000000},
      {4, 0x80000000},
      {5, 0x33800000},
      {6, 0x387fc000},
      {7, 0x38800000},
      {8, 0xbf0e2000},
      {9, 0xbec76000},
      {63, 0xbe498000}}},
    {"packed.u8.2d", {{0, 0x41b80000}, {1, 0x431d0000}, {223, 0x43010000}}},
    {"scalar.f32", {{0, 0x40600000}}},
    {kDeep + "1.w1.weight_packed", {{0, 0x429c0000}, {63, 0x433c0000}}},
    {"rank3.f32", {{0, 0xbef2b6be}, {23, 0x3fac81d6}}},
    {"rank4.u8", {{0, 0x43140000}, {15, 0x42540000}}},
    {"second.shard.f32", {{0, 0xbec47471}, {99, 0xbf8f9775}}},
    {"second.shard.u8", {{0, 0x40400000}, {299, 0x43590000}}},
    {kWeird, {{0, 0x3f800000}, {1, 0x40000000}, {2, 0x40400000}}},
};

std::vector<std::byte> file_bytes(const fs::path& p, uint64_t offset, size_t n) {
  std::ifstream in(p, std::ios::binary);
  in.seekg(static_cast<std::streamoff>(offset));
  std::vector<std::byte> v(n);
  in.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(n));
  REQUIRE(static_cast<size_t>(in.gcount()) == n);
  return v;
}

std::vector<float> widen(const ShardSet& set, const TensorInfo& t) {
  std::vector<std::byte> raw(t.nbytes);
  set.read(t, raw);
  std::vector<float> out(t.numel());
  widen_to_f32(t.dtype, raw, out);
  return out;
}

// [u64 LE header length][header][data_len zero bytes]; `length` overrides the length field.
void write_shard(const fs::path& p, const std::string& header, uint64_t data_len,
                 std::optional<uint64_t> length = {}) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  uint64_t n = length.value_or(header.size());
  for (int i = 0; i < 8; ++i) out.put(static_cast<char>((n >> (8 * i)) & 0xFF));
  out << header;
  out << std::string(data_len, '\0');
}

std::string entry(const std::string& name, const std::string& dtype, const std::string& shape, uint64_t s,
                  uint64_t e) {
  return "\"" + name + "\":{\"dtype\":\"" + dtype + "\",\"shape\":" + shape + ",\"data_offsets\":[" +
         std::to_string(s) + "," + std::to_string(e) + "]}";
}

std::string refusal(const fs::path& dir) {
  try {
    ShardSet::open(dir);
  } catch (const Error& e) {
    const std::string m = e.what();
    CHECK(m.find('\n') == std::string::npos);
    return m;
  }
  FAIL("opened a malformed shard set in " << dir);
  return {};
}

bool has(const std::string& m, const std::string& part) {
  return m.find(part) != std::string::npos;
}

// One malformed shard named model-00001-of-00001.safetensors; returns the refusal.
std::string refuse_one(const std::string& header, uint64_t data_len, std::optional<uint64_t> length = {}) {
  TempDir d;
  const fs::path shard = d / "model-00001-of-00001.safetensors";
  write_shard(shard, header, data_len, length);
  const std::string m = refusal(d.path);
  CHECK_MESSAGE(has(m, shard.string()), m);
  return m;
}

}  // namespace

TEST_CASE("st fixture: every tensor round-trips dtype, shape, numel, shard, offset, nbytes") {
  const ShardSet set = ShardSet::open(kSt);
  CHECK(set.shard_count() == 2);
  CHECK(set.shard_path(0) == kSt / "model-00001-of-00002.safetensors");
  CHECK(set.shard_path(1) == kSt / "model-00002-of-00002.safetensors");
  CHECK(set.shard_size(0) == 2906);
  CHECK(set.shard_size(1) == 973);
  CHECK(set.tensor_count() == kExpect.size());
  for (const Expect& e : kExpect) {
    CAPTURE(e.name);
    const auto t = set.find(e.name);
    REQUIRE(t.has_value());
    CHECK(t->dtype == e.dtype);
    CHECK(t->rank == e.shape.size());
    uint64_t numel = 1;
    for (size_t i = 0; i < 4; ++i) {
      CHECK(t->shape[i] == (i < e.shape.size() ? e.shape[i] : 1));
      if (i < e.shape.size()) numel *= e.shape[i];
    }
    CHECK(t->numel() == numel);
    CHECK(t->shard == e.shard);
    CHECK(t->offset == kDataStart[e.shard] + e.start);
    CHECK(t->nbytes == e.end - e.start);
    CHECK(t->nbytes == numel * dtype_size(e.dtype));
  }
  CHECK(set.find("scalar.f32")->numel() == 1);
  CHECK(set.find("empty.f32")->numel() == 0);
  CHECK(set.index_bytes() > 0);
  CHECK(set.shard_file(1).size() == 973);
  CHECK(set.shard_file(1).path() == set.shard_path(1));
  CHECK_THROWS_AS(set.shard_path(2), Error);
}

TEST_CASE("st fixture: absent names miss; __metadata__ is not a tensor") {
  const ShardSet set = ShardSet::open(kSt);
  for (const std::string& n :
       {std::string("__metadata__"), std::string(""), std::string("plain"), std::string("plain.f32"),
        std::string("plain.f32.2d "), std::string("plain.f32.2D"), std::string("zzz"), std::string("a"),
        kDeep + "2.w1.weight_packed", kDeep, std::string("weird\\name"),
        std::string("weird\\name.\"with\"quotes!"), std::string("second.shard.f32\0", 17)}) {
    CHECK_MESSAGE(!set.find(n).has_value(), n);
  }
}

TEST_CASE("st fixture: for_each visits every tensor once, in name order") {
  const ShardSet set = ShardSet::open(kSt);
  std::vector<std::string> seen;
  set.for_each([&](std::string_view name, const TensorInfo& t) {
    seen.emplace_back(name);
    const auto f = set.find(name);
    REQUIRE(f.has_value());
    CHECK(f->offset == t.offset);
    CHECK(f->shard == t.shard);
  });
  CHECK(seen.size() == kExpect.size());
  CHECK(std::is_sorted(seen.begin(), seen.end()));
  CHECK(std::find(seen.begin(), seen.end(), kWeird) != seen.end());
}

TEST_CASE("st fixture: widened values are bitwise exact at the listed indices") {
  const ShardSet set = ShardSet::open(kSt);
  for (const auto& [name_, bits] : kBits) {
    const auto& name = name_;  // doctest's lambdas need a variable: clang 14 cannot capture a binding
    CAPTURE(name);
    const auto t = set.find(name);
    REQUIRE(t.has_value());
    const std::vector<float> v = widen(set, *t);
    for (auto [i_, b] : bits) {
      const auto& i = i_;  // doctest's lambdas need a variable: clang 14 cannot capture a binding
      CAPTURE(i);
      CHECK(std::bit_cast<uint32_t>(v.at(i)) == b);
    }
  }
  CHECK(widen(set, *set.find("scalar.f32")).at(0) == 3.5f);
  CHECK(widen(set, *set.find("empty.f32")).empty());
}

TEST_CASE("st fixture: raw byte reads equal the file bytes") {
  const ShardSet set = ShardSet::open(kSt);
  for (const Expect& e : kExpect) {
    const auto t = set.find(e.name);
    REQUIRE(t.has_value());
    std::vector<std::byte> got(t->nbytes);
    set.read(*t, got);
    CHECK(got == file_bytes(e.shard ? kShard2 : kShard1, kDataStart[e.shard] + e.start, e.end - e.start));
  }
  // Any byte range, e.g. the header length prefix and the whole second shard.
  std::vector<std::byte> prefix(8);
  set.read_range(0, 0, prefix);
  CHECK(prefix == file_bytes(kShard1, 0, 8));
  std::vector<std::byte> whole(973);
  set.read_range(1, 0, whole);
  CHECK(whole == file_bytes(kShard2, 0, 973));
  std::vector<std::byte> wrong(5);
  CHECK_THROWS_AS(set.read(*set.find("scalar.f32"), wrong), Error);
  std::vector<std::byte> past(10);
  CHECK_THROWS_AS(set.read_range(1, 970, past), Error);
  CHECK_THROWS_AS(set.read_range(2, 0, past), Error);
}

TEST_CASE("widening: every F16 and BF16 bit pattern maps exactly") {
  // Against the value definition: F16 = (-1)^s 2^(e-15) (1 + m/1024), subnormal 2^-14 m/1024.
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const uint32_t s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
    const float got = f16_to_f32(static_cast<uint16_t>(h));
    if (e == 31) {
      CHECK((m == 0 ? std::isinf(got) : std::isnan(got)));
      if (m) CHECK((std::bit_cast<uint32_t>(got) & 0x7FFFFF) == m << 13);
      CHECK(std::signbit(got) == (s == 1));
      continue;
    }
    const double mag = e == 0 ? std::ldexp(double(m), -24) : std::ldexp(1.0 + m / 1024.0, int(e) - 15);
    const float want = static_cast<float>(s ? -mag : mag);
    if (std::bit_cast<uint32_t>(got) != std::bit_cast<uint32_t>(want)) {
      FAIL("f16 " << h);
    }
  }
  CHECK(std::bit_cast<uint32_t>(bf16_to_f32(0x7fc1)) == 0x7fc10000u);
  CHECK(std::bit_cast<uint32_t>(bf16_to_f32(0x0001)) == 0x00010000u);
  // BF16 is the top half of an f32: every pattern, NaN payloads and subnormals included.
  for (uint32_t b = 0; b < 0x10000; ++b)
    if (std::bit_cast<uint32_t>(bf16_to_f32(static_cast<uint16_t>(b))) != b << 16) FAIL("bf16 " << b);
  // widen_to_f32 (what stages/bind.cpp widens weights with) over a buffer of every little-endian
  // pattern gives the scalar maps' bits, element for element.
  std::vector<std::byte> all(2 * 0x10000);
  for (uint32_t v = 0; v < 0x10000; ++v) {
    all[2 * v] = std::byte(v & 0xFF);
    all[2 * v + 1] = std::byte(v >> 8);
  }
  std::vector<float> wide(0x10000);
  for (DType d : {DType::F16, DType::BF16}) {
    widen_to_f32(d, all, wide);
    for (uint32_t v = 0; v < 0x10000; ++v) {
      const float want = d == DType::F16 ? f16_to_f32(uint16_t(v)) : bf16_to_f32(uint16_t(v));
      if (std::bit_cast<uint32_t>(wide[v]) != std::bit_cast<uint32_t>(want)) FAIL("widen_to_f32 " << v);
    }
  }
  CHECK_THROWS_AS(widen_to_f32(DType::F16, std::span(all).first(3), std::span(wide).first(1)),
                  std::invalid_argument);
}

TEST_CASE("cache fixture: 24 experts x 6 tensors with the documented byte pattern") {
  const ShardSet set = ShardSet::open(fs::path(K3_FIXTURES) / "cache");
  CHECK(set.tensor_count() == 144);
  for (int e : {0, 7, 23}) {
    for (int which = 0; which < 3; ++which) {
      for (bool scale : {false, true}) {
        const std::string name = kDeep + std::to_string(e) + ".w" + std::to_string(which + 1) +
                                 (scale ? ".weight_scale" : ".weight_packed");
        const auto t = set.find(name);
        REQUIRE(t.has_value());
        CHECK(t->dtype == DType::U8);
        CHECK(t->nbytes == (scale ? 32u : 512u));
        std::vector<std::byte> b(t->nbytes);
        set.read(*t, b);
        const int base = (977 * e + 31 * which + (scale ? 7 : 0)) & 0xFF;
        for (size_t k = 0; k < b.size(); ++k) {
          if (std::to_integer<int>(b[k]) != int((k + base) % 251)) FAIL(name << " byte " << k);
        }
      }
    }
  }
}

TEST_CASE("model.safetensors.index.json names the shards (deduplicated, sorted)") {
  TempDir d;
  // Copies named so that the index, not the directory listing, decides what is read.
  fs::copy_file(kShard2, d / "b.safetensors");
  fs::copy_file(kShard1, d / "a.safetensors");
  fs::copy_file(kShard1, d / "ignored.bin");
  std::ofstream(d / "model.safetensors.index.json")
      << R"({"metadata": {"total_size": 2588}, "weight_map": {"second.shard.f32": "b.safetensors",
         "plain.f32.2d": "a.safetensors", "scalar.f32": "a.safetensors"}})";
  const ShardSet set = ShardSet::open(d.path);
  CHECK(set.shard_count() == 2);
  CHECK(set.shard_path(0).filename() == "a.safetensors");
  CHECK(set.shard_path(1).filename() == "b.safetensors");
  CHECK(set.tensor_count() == 13);
  CHECK(set.find("second.shard.f32")->shard == 1);
}

TEST_CASE("refused: a shard named by the index is missing (names the index, the tensor and the shard)") {
  TempDir d;
  fs::copy_file(kShard1, d / "a.safetensors");
  std::ofstream(d / "model.safetensors.index.json")
      << R"({"weight_map": {"plain.f32.2d": "a.safetensors", "second.shard.f32": "gone.safetensors"}})";
  const std::string m = refusal(d.path);
  CHECK(has(m, "model.safetensors.index.json"));
  CHECK(has(m, "second.shard.f32"));
  CHECK(has(m, "gone.safetensors"));
  CHECK(has(m, "missing"));
}

TEST_CASE("refused: the index disagrees with the headers, or escapes the directory") {
  TempDir d;
  fs::copy_file(kShard1, d / "a.safetensors");
  fs::copy_file(kShard2, d / "b.safetensors");
  std::ofstream(d / "model.safetensors.index.json")
      << R"({"weight_map": {"plain.f32.2d": "b.safetensors", "scalar.f32": "a.safetensors"}})";
  std::string m = refusal(d.path);
  CHECK(has(m, "plain.f32.2d"));
  CHECK(has(m, "a.safetensors"));
  std::ofstream(d / "model.safetensors.index.json")
      << R"({"weight_map": {"nope": "a.safetensors", "scalar.f32": "a.safetensors"}})";
  m = refusal(d.path);
  CHECK(has(m, "nope"));
  CHECK(has(m, "no shard header"));
  std::ofstream(d / "model.safetensors.index.json") << R"({"weight_map": {"x": "../a.safetensors"}})";
  CHECK(has(refusal(d.path), "not a file name"));
  std::ofstream(d / "model.safetensors.index.json") << R"({"weight_map": {"x": "a.safetensors",)";
  CHECK(has(refusal(d.path), "malformed JSON"));
}

TEST_CASE("refused: header length past the end of the file") {
  const std::string h = "{" + entry("t", "F32", "[2]", 0, 8) + "}";
  const std::string m = refuse_one(h, 8, 1'000'000);
  CHECK(has(m, "header length 1000000 runs past the end of the file"));
  CHECK(has(refuse_one("", 0, 0), "malformed JSON"));
  TempDir d;
  std::ofstream(d / "x.safetensors") << "abc";
  CHECK(has(refusal(d.path), "too short"));
}

TEST_CASE("refused: data offsets outside the data section") {
  const std::string h =
      "{" + entry("ok", "U8", "[4]", 0, 4) + "," + entry("late.tensor", "F32", "[100]", 4, 404) + "}";
  const std::string m = refuse_one(h, 100);
  CHECK(has(m, "late.tensor: data_offsets [4, 404] lie outside the data section (100 bytes)"));
  CHECK(has(refuse_one("{" + entry("rev", "U8", "[0]", 8, 4) + "}", 16),
            "rev: data_offsets [8, 4] end before"));
  // Offsets near 2^64 are compared, never added.
  CHECK(has(
      refuse_one("{" + entry("far", "U8", "[1]", 18446744073709551614ull, 18446744073709551615ull) + "}", 4),
      "far: data_offsets [18446744073709551614, 18446744073709551615] lie outside"));
}

TEST_CASE("refused: overlapping tensors (names both)") {
  const std::string h =
      "{" + entry("first", "F32", "[4]", 0, 16) + "," + entry("second", "F32", "[4]", 8, 24) + "}";
  const std::string m = refuse_one(h, 24);
  CHECK(has(m, "second: data [8, 24) overlaps tensor first [0, 16)"));
  // Zero-length tensors overlap nothing; adjacent tensors do not overlap.
  TempDir d;
  write_shard(d / "a.safetensors",
              "{" + entry("a", "F32", "[4]", 0, 16) + "," + entry("z", "F32", "[0]", 8, 8) + "," +
                  entry("b", "F32", "[4]", 16, 32) + "}",
              32);
  CHECK(ShardSet::open(d.path).tensor_count() == 3);
}

TEST_CASE("refused: unknown dtype") {
  const std::string m = refuse_one("{" + entry("q.weight", "F64", "[2]", 0, 16) + "}", 16);
  CHECK(has(m, "q.weight: unknown dtype \"F64\""));
  CHECK(has(refuse_one("{" + entry("r", "I8R", "[2]", 0, 2) + "}", 2), "r: unknown dtype \"I8R\""));
  CHECK(has(refuse_one(R"({"s":{"dtype":7,"shape":[1],"data_offsets":[0,1]}})", 1),
            "s: dtype is not a string"));
}

TEST_CASE("refused: numel x dtype size differs from the byte length") {
  const std::string m = refuse_one("{" + entry("short.one", "F32", "[4]", 0, 12) + "}", 12);
  CHECK(has(m,
            "short.one: shape [4] x F32 needs 4 elements x 4 bytes, but data_offsets [0, 12] hold 12 bytes"));
  // Element counts that overflow 64 bits are caught, not wrapped.
  const std::string o = refuse_one("{" + entry("wrap", "U8", "[4294967296, 4294967296]", 0, 0) + "}", 0);
  CHECK(has(o, "wrap: shape [4294967296, 4294967296] has more elements than 2^64"));
  CHECK(has(refuse_one("{" + entry("wrap2", "F32", "[4611686018427387904]", 0, 0) + "}", 0), "wrap2: shape"));
}

TEST_CASE("refused: rank above 4") {
  const std::string m = refuse_one("{" + entry("five.d", "U8", "[1,1,1,1,2]", 0, 2) + "}", 2);
  CHECK(has(m, "five.d: rank 5 exceeds the supported maximum of 4"));
}

TEST_CASE("refused: malformed entries") {
  CHECK(has(refuse_one(R"({"n":{"dtype":"U8","shape":[-1],"data_offsets":[0,0]}})", 0),
            "n: shape[0] = -1 is negative"));
  CHECK(
      has(refuse_one(R"({"n":{"dtype":"U8","shape":[1.5],"data_offsets":[0,1]}})", 1), "n: shape[0] is not"));
  CHECK(
      has(refuse_one(R"({"n":{"dtype":"U8","shape":[1],"data_offsets":[0]}})", 1), "n: data_offsets is not"));
  CHECK(has(refuse_one(R"({"n":{"dtype":"U8","shape":[1],"data_offsets":[0,-1]}})", 1),
            "n: data_offsets holds"));
  CHECK(has(refuse_one(R"({"n":{"shape":[1],"data_offsets":[0,1]}})", 1), "n: no dtype"));
  CHECK(has(refuse_one(R"({"n":{"dtype":"U8","data_offsets":[0,1]}})", 1), "n: no shape"));
  CHECK(has(refuse_one(R"({"n":{"dtype":"U8","shape":[1]}})", 1), "n: no data_offsets"));
  CHECK(has(refuse_one(R"({"n":[1,2]})", 1), "n: header entry is not a JSON object"));
  CHECK(has(refuse_one(R"({"n":{"dtype":"U8","dtype":"U8","shape":[1],"data_offsets":[0,1]}})", 1),
            "n: dtype given twice"));
  CHECK(has(refuse_one(R"([1,2])", 1), "header is not a JSON object"));
  CHECK(has(refuse_one(R"({"__metadata__":{"format":3}})", 1),
            "__metadata__: value of \"format\" is not a string"));
}

TEST_CASE("refused: duplicate names across shards name both shards") {
  TempDir d;
  write_shard(d / "model-00001-of-00002.safetensors", "{" + entry("shared.name", "U8", "[4]", 0, 4) + "}", 4);
  write_shard(d / "model-00002-of-00002.safetensors",
              "{" + entry("other", "U8", "[4]", 0, 4) + "," + entry("shared.name", "U8", "[4]", 4, 8) + "}",
              8);
  const std::string m = refusal(d.path);
  CHECK(has(m, "model-00001-of-00002.safetensors"));
  CHECK(has(m, "model-00002-of-00002.safetensors"));
  CHECK(has(m, "shared.name: duplicate tensor name"));
  // Within one header too.
  const std::string one =
      refuse_one("{" + entry("twice", "U8", "[4]", 0, 4) + "," + entry("twice", "U8", "[4]", 4, 8) + "}", 8);
  CHECK(has(one, "twice: duplicate tensor name twice in model-00001-of-00001.safetensors"));
}

TEST_CASE("refused: a name listed twice with the same span is a duplicate, not an overlap") {
  const std::string m =
      refuse_one("{" + entry("same", "U8", "[4]", 0, 4) + "," + entry("same", "U8", "[4]", 0, 4) + "}", 4);
  CHECK_MESSAGE(has(m, "same: duplicate tensor name same in model-00001-of-00001.safetensors"), m);
  CHECK_FALSE(has(m, "overlaps"));
}

TEST_CASE("refused: invalid UTF-8 in the header names the tensor") {
  const std::string m = refuse_one("{" + entry("ok", "U8", "[1]", 0, 1) + "," +
                                       entry("bad\xff"
                                             "name",
                                             "U8", "[1]", 1, 2) +
                                       "}",
                                   2);
  CHECK(has(m, "bad\\xFFname: invalid UTF-8 in the header at byte"));
  // Overlong encoding and a lone surrogate are not UTF-8 either.
  CHECK(has(refuse_one("{" + entry("o\xc0\xaf", "U8", "[1]", 0, 1) + "}", 1), "invalid UTF-8"));
  CHECK(has(refuse_one("{" + entry("s\xed\xa0\x80", "U8", "[1]", 0, 1) + "}", 1), "invalid UTF-8"));
}

TEST_CASE("refused: malformed JSON names the tensor it is in") {
  const std::string ok = entry("good.one", "U8", "[1]", 0, 1);
  std::string m =
      refuse_one("{" + ok + R"(,"broken.one":{"dtype":"U8" "shape":[1],"data_offsets":[1,2]}})", 2);
  CHECK(has(m, "broken.one: malformed JSON in the header"));
  m = refuse_one("{" + ok + R"(,"cut.off":{"dtype":"U8","shape":[1],"data_offsets":[1,2])", 2);
  CHECK(has(m, "cut.off: malformed JSON"));
  m = refuse_one("{" + ok + R"(,"unterminated:{"dtype":"U8"}})", 2);
  CHECK(has(m, "malformed JSON"));
  m = refuse_one("{" + ok + "} trailing", 1);
  CHECK(has(m, "malformed JSON"));
  m = refuse_one("{" + ok + R"(,"lit":{"dtype":"U8","shape":[1],"data_offsets":[1,2],"x":tru}})", 2);
  CHECK(has(m, "lit: malformed JSON"));
}

TEST_CASE("refused: a number past 64 bits names the tensor and field holding it, not the last tensor") {
  const std::string first = entry("first", "U8", "[1]", 0, 1), last = entry("last", "U8", "[1]", 2, 3);
  std::string m = refuse_one(
      "{" + first + R"(,"big.shape":{"dtype":"U8","shape":[99999999999999999999],"data_offsets":[1,2]},)" +
          last + "}",
      3);
  CHECK_MESSAGE(has(m, "big.shape: malformed JSON in the header, in \"shape\""), m);
  CHECK_FALSE(has(m, "last"));
  m = refuse_one("{" + first +
                     R"(,"big.off":{"dtype":"U8","shape":[1],"data_offsets":[1,18446744073709551616]},)" +
                     last + "}",
                 3);
  CHECK_MESSAGE(has(m, "big.off: malformed JSON in the header, in \"data_offsets\""), m);
  // In a field the format ignores, and a float out of range.
  m = refuse_one(
      "{" + first + R"(,"extra":{"dtype":"U8","shape":[1],"data_offsets":[1,2],"note":1e999},)" + last + "}",
      3);
  CHECK_MESSAGE(has(m, "extra: malformed JSON in the header, in \"note\""), m);
  m = refuse_one(R"({"__metadata__":{"n":-99999999999999999999},)" + first + "}", 1);
  CHECK_MESSAGE(has(m, "__metadata__: malformed JSON in the header, in \"n\""), m);
}

TEST_CASE("refused: a shard that is a directory is named as a directory, not as missing") {
  TempDir d;
  fs::copy_file(kShard1, d / "a.safetensors");
  fs::create_directory(d / "b.safetensors");
  std::ofstream(d / "model.safetensors.index.json")
      << R"({"weight_map": {"plain.f32.2d": "a.safetensors", "second.shard.f32": "b.safetensors"}})";
  std::string m = refusal(d.path);
  CHECK_MESSAGE(has(m, "second.shard.f32: names shard " + d / "b.safetensors" + ", which is a directory"), m);
  CHECK_FALSE(has(m, "missing"));
  // Without an index, a *.safetensors directory is refused by name rather than skipped.
  fs::remove(d / "model.safetensors.index.json");
  m = refusal(d.path);
  CHECK_MESSAGE(has(m, d / "b.safetensors" + ": is a directory"), m);
}

TEST_CASE("refused: an empty directory, a missing directory") {
  TempDir d;
  CHECK(has(refusal(d.path), "no *.safetensors"));
  CHECK(has(refusal(d.path / "nope"), "nope"));
}

TEST_CASE("never crashes on corrupted headers: random byte flips either open or throw Error") {
  const std::vector<std::byte> orig = file_bytes(kShard1, 0, 2906);
  std::mt19937 rng(1234);
  TempDir d;
  const fs::path p = d / "model-00001-of-00001.safetensors";
  int refused = 0;
  for (int iter = 0; iter < 400; ++iter) {
    std::vector<std::byte> b = orig;
    const int flips = 1 + static_cast<int>(rng() % 3);
    for (int k = 0; k < flips; ++k) {
      const size_t at = rng() % 1030;  // length prefix and header
      b[at] = std::byte(rng() & 0xFF);
    }
    std::ofstream(p, std::ios::binary | std::ios::trunc).write(reinterpret_cast<const char*>(b.data()), 2906);
    try {
      const ShardSet set = ShardSet::open(d.path);
      CHECK(set.tensor_count() <= 11);
    } catch (const Error& e) {
      ++refused;
      CHECK(std::string(e.what()).find('\n') == std::string::npos);
    }
  }
  CHECK(refused > 0);
}
