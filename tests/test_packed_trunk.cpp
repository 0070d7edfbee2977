// io/packed_trunk: pack a small checkpoint written here (real names, trunk tensors interleaved with
// routed experts, one layer split across shards, odd sizes, one tensor larger than the 64 MiB
// staging buffer), then check every byte, the alignment, the checksums, the refusals and that an
// interrupted pack leaves nothing that looks complete.
#include <doctest/doctest.h>
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "io/error.hpp"
#include "io/packed_trunk.hpp"
#include "io/safetensors.hpp"
#include "io/safetensors_writer.hpp"
#include "io/xxh64.hpp"
#include "tests/temp_dir.hpp"

namespace fs = std::filesystem;
using k3::io::DType;
using k3::io::PackedTrunk;
using k3::io::ShardSet;
using k3::io::TensorEntry;
using k3::test::TempDir;

namespace {

struct ScopedEnv {
  const char* name;
  ScopedEnv(const char* n, const char* v) : name(n) { ::setenv(n, v, 1); }
  ~ScopedEnv() { ::unsetenv(name); }
};

uint64_t mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

void write_shard(const fs::path& path, std::vector<TensorEntry> tensors, uint64_t seed) {
  k3::io::SafetensorsWriter w(path, std::move(tensors));
  std::vector<std::byte> chunk(size_t{1} << 20);
  for (uint64_t left = w.layout().data_bytes, i = 0; left > 0; ++i) {
    size_t n = size_t(std::min<uint64_t>(left, chunk.size()));
    // Eight bytes of each 64-bit draw: the 73 MB fill at an eighth of the hashing.
    for (size_t j = 0; j < n; ++j)
      chunk[j] = std::byte((mix(seed * 1000003 + (i * chunk.size() + j) / 8) >> (8 * (j % 8))) & 0xff);
    w.append(std::span(chunk).first(n));
    left -= n;
  }
  w.finish();
  w.commit();
}

const std::string P = "language_model.model.";

// 3 layers over 2 shards. Layer 1's trunk is split between the shards and interleaved with its
// experts; layer 2 holds a 70 MB matrix (crosses the 64 MiB staging buffers).
fs::path write_checkpoint(const fs::path& dir) {
  fs::create_directories(dir);
  auto L = [](int l, const std::string& rest) { return P + "layers." + std::to_string(l) + "." + rest; };
  write_shard(dir / "model-00001-of-00002.safetensors",
              {
                  {P + "embed_tokens.weight", DType::BF16, {64, 16}},
                  {L(0, "input_layernorm.weight"), DType::BF16, {16}},
                  {L(0, "self_attn.q_proj.weight"), DType::BF16, {33, 16}},
                  {L(0, "self_attn.A_log"), DType::F32, {7}},
                  {L(0, "mlp.gate_proj.weight"), DType::BF16, {5, 3}},
                  {L(1, "input_layernorm.weight"), DType::BF16, {16}},
                  {L(1, "block_sparse_moe.experts.0.w1.weight_packed"), DType::U8, {48, 8}},
                  {L(1, "block_sparse_moe.gate.weight"), DType::BF16, {4, 16}},
                  {L(1, "block_sparse_moe.experts.0.w1.weight_scale"), DType::U8, {48, 1}},
                  {L(1, "block_sparse_moe.gate.e_score_correction_bias"), DType::F32, {4}},
              },
              1);
  write_shard(dir / "model-00002-of-00002.safetensors",
              {
                  {L(1, "self_attn.o_proj.weight"), DType::BF16, {16, 9}},
                  {L(1, "block_sparse_moe.experts.1.w2.weight_packed"), DType::U8, {16, 3}},
                  {L(2, "post_attention_layernorm.weight"), DType::F16, {16}},
                  {L(2, "mlp.down_proj.weight"), DType::BF16, {35, 1 << 20}},
                  {L(2, "self_attn.dt_bias"), DType::F32, {3}},
                  {P + "norm.weight", DType::BF16, {16}},
                  {"language_model.lm_head.weight", DType::BF16, {64, 16}},
              },
              2);
  return dir;
}

// That checkpoint in `dir`, a copy of its own for each test (some change its bytes): written once a
// process (under ASan the 73 MB fill was most of this file's time), copied after.
fs::path make_checkpoint(const fs::path& dir) {
  static const TempDir written(fs::current_path(), "k3_packed_trunk_model_");
  static const fs::path source = write_checkpoint(written.path / "model");
  fs::create_directories(dir);
  for (const auto& e : fs::directory_iterator(source)) fs::copy_file(e.path(), dir / e.path().filename());
  return dir;
}

std::vector<std::byte> read_file_range(const fs::path& p, uint64_t off, uint64_t n) {
  std::vector<std::byte> b(n);
  std::ifstream f(p, std::ios::binary);
  f.seekg(std::streamoff(off));
  f.read(reinterpret_cast<char*>(b.data()), std::streamsize(n));
  REQUIRE(uint64_t(f.gcount()) == n);
  return b;
}

void flip_byte(const fs::path& p, uint64_t off) {
  int fd = ::open(p.c_str(), O_RDWR);
  REQUIRE(fd >= 0);
  unsigned char c;
  REQUIRE(::pread(fd, &c, 1, off_t(off)) == 1);
  c ^= 0x40;
  REQUIRE(::pwrite(fd, &c, 1, off_t(off)) == 1);
  ::close(fd);
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const k3::io::Error& e) {
    return e.what();
  }
  return "";
}

bool nothing_complete(const fs::path& out) {
  return !fs::exists(out / "trunk.json") && !fs::exists(out / "trunk.bin");
}

std::string slurp(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

}  // namespace

TEST_CASE("XXH64 matches the reference values") {
  // The empty input (a null span) once reached memcpy: the sanitized build reports that, and
  // an empty update in the middle of a stream must change nothing.
  CHECK(k3::io::xxh64({}) == 0xEF46DB3751D8E999ull);
  std::string abc = "abc";
  CHECK(k3::io::xxh64(std::as_bytes(std::span(abc))) == 0x44BC2CF5AD770999ull);
  // Streaming in odd pieces gives the one-shot value.
  std::vector<std::byte> b(1000);
  for (size_t i = 0; i < b.size(); ++i) b[i] = std::byte(mix(i) & 0xff);
  k3::io::Xxh64 h;
  for (size_t i = 0; i < b.size(); i += 37) {
    h.update(std::span(b).subspan(i, std::min<size_t>(37, b.size() - i)));
    h.update({});
  }
  CHECK(h.digest() == k3::io::xxh64(b));
}

TEST_CASE("trunk_layer_of keeps layer tensors and drops routed experts and model-level tensors") {
  CHECK(k3::io::trunk_layer_of(P + "layers.12.self_attn.q_proj.weight") == 12);
  CHECK(k3::io::trunk_layer_of(P + "layers.3.block_sparse_moe.gate.weight") == 3);
  CHECK(k3::io::trunk_layer_of(P + "layers.3.block_sparse_moe.shared_experts.up_proj.weight") == 3);
  CHECK(k3::io::trunk_layer_of(P + "layers.3.block_sparse_moe.experts.7.w1.weight_packed") == -1);
  CHECK(k3::io::trunk_layer_of(P + "embed_tokens.weight") == -1);
  CHECK(k3::io::trunk_layer_of("language_model.lm_head.weight") == -1);
  CHECK(k3::io::trunk_layer_of(P + "layers.x.foo") == -1);
}

TEST_CASE("pack-trunk copies every trunk tensor byte-exactly to aligned offsets with checksums") {
  TempDir tmp(fs::current_path(), "k3_packed_trunk_");  // the build directory: real disk
  fs::path model = make_checkpoint(tmp.path / "model");
  fs::path out = tmp.path / "trunk";
  ShardSet shards = ShardSet::open(model);
  uint64_t calls = 0, last_done = 0, last_total = 0;
  k3::io::PackStats st = k3::io::pack_trunk(shards, 3, out, [&](uint64_t d, uint64_t t) {
    ++calls;
    CHECK(d >= last_done);
    last_done = d, last_total = t;
  });
  CHECK(calls >= 2);  // the 70 MB layer needs more than one staging buffer
  CHECK(last_done == last_total);
  CHECK(fs::exists(out / "trunk.bin"));
  CHECK(fs::exists(out / "trunk.json"));
  for (const auto& e : fs::directory_iterator(out)) CHECK(e.path().extension() != ".partial");
  CHECK(fs::file_size(out / "trunk.bin") == st.bytes_written);

  PackedTrunk t = PackedTrunk::open(out, 3);
  CHECK(t.file().direct());  // the build directory is a real filesystem
  REQUIRE(t.layers().size() == 3);
  std::set<std::string> packed;
  for (const auto& L : t.layers()) {
    CAPTURE(L.layer);
    CHECK(L.file_off % 4096 == 0);
    CHECK(L.nbytes % 4096 == 0);
    for (const auto& tt : L.tensors) {
      CAPTURE(tt.name);
      CHECK(tt.off % 64 == 0);
      CHECK(k3::io::trunk_layer_of(tt.name) == L.layer);
      auto src = shards.find(tt.name);
      REQUIRE(src);
      CHECK(tt.nbytes == src->nbytes);
      CHECK(tt.dtype == src->dtype);
      std::vector<std::byte> want(src->nbytes);
      shards.read(*src, want);
      CHECK(read_file_range(out / "trunk.bin", L.file_off + tt.off, tt.nbytes) == want);
      packed.insert(tt.name);
    }
    CHECK_NOTHROW(t.verify_layer(L.layer));
  }
  // Exactly the trunk: every layer tensor that is not a routed expert.
  std::set<std::string> want;
  shards.for_each([&](std::string_view n, const k3::io::TensorInfo&) {
    if (k3::io::trunk_layer_of(n) >= 0) want.insert(std::string(n));
  });
  CHECK(packed == want);
  CHECK(want.size() == 11);
  CHECK(t.layer(1).find(P + "layers.1.self_attn.o_proj.weight") != nullptr);  // from the second shard
  CHECK(t.largest_layer() == t.layer(2).nbytes);
  CHECK(t.index_bytes() > 0);
  // Padding is zero: the byte after layer 0's last tensor.
  const auto& L0 = t.layer(0);
  uint64_t end0 = 0;
  for (const auto& tt : L0.tensors) end0 = std::max(end0, tt.off + tt.nbytes);
  CHECK(read_file_range(out / "trunk.bin", L0.file_off + end0, 1)[0] == std::byte{0});

  SUBCASE("a flipped byte fails that layer's checksum only, naming trunk.bin") {
    flip_byte(out / "trunk.bin", t.layer(1).file_off + t.layer(1).tensors[0].off + 1);
    PackedTrunk t2 = PackedTrunk::open(out, 3);
    CHECK_NOTHROW(t2.verify_layer(0));
    std::string m = error_of([&] { t2.verify_layer(1); });
    CHECK(m.find("trunk.bin") != std::string::npos);
    CHECK(m.find("layer 1 checksum mismatch") != std::string::npos);
    CHECK(m.find('\n') == std::string::npos);
  }
  SUBCASE("a layer count other than the config's is refused, naming trunk.json") {
    std::string m = error_of([&] { PackedTrunk::open(out, 4); });
    CHECK(m.find("trunk.json") != std::string::npos);
    CHECK(m.find("holds 3 layers, the config has 4") != std::string::npos);
  }
  SUBCASE("a truncated trunk.bin is refused at open, naming the file") {
    REQUIRE(::truncate((out / "trunk.bin").c_str(), off_t(t.layer(2).file_off + 4096)) == 0);
    std::string m = error_of([&] { PackedTrunk::open(out, 3); });
    CHECK(m.find("trunk.bin") != std::string::npos);
    CHECK(m.find("past the end") != std::string::npos);
    CHECK(m.find('\n') == std::string::npos);
  }
  SUBCASE("trunk.bin shrinking after open makes verify fail with an error naming it") {
    PackedTrunk t2 = PackedTrunk::open(out, 3);
    REQUIRE(::truncate((out / "trunk.bin").c_str(), off_t(t.layer(2).file_off + 4096)) == 0);
    std::string m = error_of([&] { t2.verify_layer(2); });
    CHECK(m.find("trunk.bin") != std::string::npos);
    CHECK(m.find("unreadable") != std::string::npos);
  }
  SUBCASE("a missing trunk.bin or a broken trunk.json is refused naming the file") {
    fs::remove(out / "trunk.bin");
    CHECK(error_of([&] { PackedTrunk::open(out, 3); }).find("trunk.bin") != std::string::npos);
  }
  SUBCASE("a trunk.json without checksums (reference tools) opens; verify says there is none") {
    std::string j;
    {
      std::ifstream f(out / "trunk.json");
      j.assign(std::istreambuf_iterator<char>(f), {});
    }
    for (size_t pos; (pos = j.find("\"xxh64\":\"")) != std::string::npos;) j.erase(pos, 8 + 1 + 16 + 1 + 1);
    std::ofstream(out / "trunk.json", std::ios::trunc) << j;
    PackedTrunk t2 = PackedTrunk::open(out, 3);
    CHECK_FALSE(t2.layer(0).has_xxh64);
    CHECK(error_of([&] { t2.verify_layer(0); }).find("no xxh64 checksum") != std::string::npos);
  }
  SUBCASE("misaligned offsets in trunk.json are refused") {
    std::string j;
    {
      std::ifstream f(out / "trunk.json");
      j.assign(std::istreambuf_iterator<char>(f), {});
    }
    auto pos = j.find("\"file_off\":" + std::to_string(t.layer(1).file_off));
    REQUIRE(pos != std::string::npos);
    j.replace(pos, 11 + std::to_string(t.layer(1).file_off).size(),
              "\"file_off\":" + std::to_string(t.layer(1).file_off + 512));
    std::ofstream(out / "trunk.json", std::ios::trunc) << j;
    std::string m = error_of([&] { PackedTrunk::open(out, 3); });
    CHECK(m.find("trunk.json") != std::string::npos);
    CHECK(m.find("4096-multiples") != std::string::npos);
    std::ofstream(out / "trunk.json", std::ios::trunc) << "{\"align\":4096,";
    CHECK(error_of([&] { PackedTrunk::open(out, 3); }).find("not valid JSON") != std::string::npos);
  }
}

TEST_CASE("a checkpoint missing a layer is refused before anything is written") {
  TempDir tmp(fs::current_path(), "k3_packed_trunk_");  // the build directory: real disk
  fs::path model = make_checkpoint(tmp.path / "model");
  ShardSet shards = ShardSet::open(model);
  std::string m = error_of([&] { k3::io::pack_trunk(shards, 4, tmp.path / "trunk"); });
  CHECK(m.find("layer 3 has no tensors") != std::string::npos);
  CHECK(nothing_complete(tmp.path / "trunk"));
  CHECK(error_of([&] { k3::io::pack_trunk(shards, 2, tmp.path / "trunk"); }).find("config has 2 layers") !=
        std::string::npos);
}

TEST_CASE("an interrupted pack leaves no trunk.json or trunk.bin") {
  TempDir tmp(fs::current_path(), "k3_packed_trunk_");  // the build directory: real disk
  fs::path model = make_checkpoint(tmp.path / "model");
  fs::path out = tmp.path / "trunk";
  SUBCASE("failure (exception): partial files are removed too") {
    ShardSet shards = ShardSet::open(model);
    ScopedEnv env("K3FLOW_FAIL_AFTER_BYTES", "4096");
    std::string m = error_of([&] { k3::io::pack_trunk(shards, 3, out); });
    CHECK(m.find("K3FLOW_FAIL_AFTER_BYTES") != std::string::npos);
    CHECK(nothing_complete(out));
    CHECK(!fs::exists(out));  // the directory the pack created goes too
  }
  SUBCASE("cancelled: throws \"interrupted\", removes the directory it created, keeps one that existed") {
    ShardSet shards = ShardSet::open(model);
    static int polls;
    polls = 0;
    auto after_two = [] { return ++polls > 2; };
    CHECK(error_of([&] {
            k3::io::pack_trunk(shards, 3, out / "a" / "b", {}, after_two);
          }).find("pack-trunk: interrupted") != std::string::npos);
    CHECK(!fs::exists(out));
    fs::create_directories(out);
    polls = 0;
    CHECK(error_of([&] { k3::io::pack_trunk(shards, 3, out, {}, after_two); }).find("interrupted") !=
          std::string::npos);
    CHECK(fs::is_directory(out));
    CHECK(fs::is_empty(out));
  }
  SUBCASE("SIGKILL mid-way: only .partial files can remain") {
    pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      ::setenv("K3FLOW_FAIL_AFTER_BYTES", "4096", 1);
      ::setenv("K3FLOW_FAIL_MODE", "kill", 1);
      try {
        ShardSet shards = ShardSet::open(model);
        k3::io::pack_trunk(shards, 3, out);
      } catch (...) {
      }
      ::_exit(0);  // not reached when the hook fires
    }
    int st = 0;
    REQUIRE(::waitpid(pid, &st, 0) == pid);
    CHECK(WIFSIGNALED(st));
    CHECK(nothing_complete(out));
    CHECK(fs::exists(out / "trunk.bin.partial"));
    // A later pack over the leftovers succeeds.
    ShardSet shards = ShardSet::open(model);
    k3::io::pack_trunk(shards, 3, out);
    CHECK_NOTHROW(PackedTrunk::open(out, 3).verify_layer(2));
  }
}

TEST_CASE("trunk.json records its source; check_source refuses another checkpoint and older trunk.json") {
  TempDir tmp(fs::current_path(), "k3_packed_trunk_");  // the build directory: real disk
  fs::path model = make_checkpoint(tmp.path / "model");
  fs::path out = tmp.path / "trunk";
  {
    ShardSet shards = ShardSet::open(model);
    k3::io::pack_trunk(shards, 3, out);
    PackedTrunk t = PackedTrunk::open(out, 3);
    REQUIRE(t.has_source());
    CHECK(t.source().shards.size() == shards.shard_count());
    CHECK(t.source().layer_samples.size() == 3);
    CHECK_NOTHROW(t.check_source(shards));
  }
  SUBCASE("one byte of a layer-1 tensor differs in the checkpoint") {
    ShardSet before = ShardSet::open(model);
    const PackedTrunk t = PackedTrunk::open(out, 3);
    const auto info = before.find(t.layer(1).tensors[0].name);
    REQUIRE(info);
    const fs::path shard = before.shard_path(info->shard);
    {
      std::fstream f(shard, std::ios::in | std::ios::out | std::ios::binary);
      f.seekg(std::streamoff(info->offset));
      char ch = 0;
      f.read(&ch, 1);
      ch = char(ch ^ 1);
      f.seekp(std::streamoff(info->offset));
      f.write(&ch, 1);
    }
    ShardSet after = ShardSet::open(model);
    const std::string m = error_of([&] { t.check_source(after); });
    CHECK(m.find(out.string()) != std::string::npos);
    CHECK(m.find("layer 1: tensor bytes differ") != std::string::npos);
    CHECK(m.find("pack-trunk") != std::string::npos);
  }
  SUBCASE("a shard's header differs") {
    std::string j = slurp(out / "trunk.json");
    const size_t at = j.find("\"header_xxh64\":\"");
    REQUIRE(at != std::string::npos);
    char& c = j[at + 16];
    c = c == '0' ? '1' : '0';
    std::ofstream(out / "trunk.json", std::ios::trunc) << j;
    const std::string m = error_of([&] { PackedTrunk::open(out, 3).check_source(ShardSet::open(model)); });
    CHECK(m.find("model-00001-of-00002.safetensors: safetensors header differs") != std::string::npos);
  }
  SUBCASE("no \"source\" (an older trunk.json): refused, asking to re-run pack-trunk") {
    std::string j = slurp(out / "trunk.json");
    const size_t s = j.find(",\n\"source\":"), e = j.find(",\"layers\":");
    REQUIRE(s != std::string::npos);
    REQUIRE(e != std::string::npos);
    j.erase(s, e - s);
    std::ofstream(out / "trunk.json", std::ios::trunc) << j;
    PackedTrunk t = PackedTrunk::open(out, 3);  // still readable (plan sizes from it)
    CHECK(!t.has_source());
    const std::string m = error_of([&] { t.check_source(ShardSet::open(model)); });
    CHECK(m.find("records no source") != std::string::npos);
    CHECK(m.find("re-run `k3flow pack-trunk") != std::string::npos);
  }
}

TEST_CASE(
    "check_loaded: a layer's bytes are hashed the first time only; a mismatch names trunk.bin and the "
    "layer") {
  TempDir tmp(fs::current_path(), "k3_packed_trunk_");  // the build directory: real disk
  fs::path model = make_checkpoint(tmp.path / "model");
  fs::path out = tmp.path / "trunk";
  ShardSet shards = ShardSet::open(model);
  k3::io::pack_trunk(shards, 3, out);
  PackedTrunk t = PackedTrunk::open(out, 3);
  for (int l : {0, 2}) {
    std::vector<std::byte> bytes = read_file_range(out / "trunk.bin", t.layer(l).file_off, t.layer(l).nbytes);
    if (l == 2) bytes[100] ^= std::byte{4};
    if (l == 0) {
      CHECK_NOTHROW(t.check_loaded(l, bytes));
      bytes[100] ^= std::byte{4};
      CHECK_NOTHROW(t.check_loaded(l, bytes));  // already verified in this process
    } else {
      const std::string m = error_of([&] { t.check_loaded(l, bytes); });
      CHECK(m.find("trunk.bin") != std::string::npos);
      CHECK(m.find("layer 2 checksum mismatch") != std::string::npos);
      CHECK(error_of([&] { t.check_loaded(l, std::span(bytes).first(4096)); }).find("bytes read") !=
            std::string::npos);
    }
  }
  // check_loaded_digest: the fused decode's first pass hashes a layer as it streams past
  const std::vector<std::byte> one =
      read_file_range(out / "trunk.bin", t.layer(1).file_off, t.layer(1).nbytes);
  CHECK(error_of([&] {
          t.check_loaded_digest(1, k3::io::xxh64(one) ^ 1);
        }).find("layer 1 checksum mismatch") != std::string::npos);
  CHECK_NOTHROW(t.check_loaded_digest(1, k3::io::xxh64(one)));
  CHECK_NOTHROW(t.check_loaded(1, std::span(one).first(4096)));  // verified once: not hashed again
}

TEST_CASE("trunk.json offsets are bound-checked without wrap-around") {
  TempDir tmp(fs::current_path(), "k3_packed_trunk_");  // the build directory: real disk
  fs::path model = make_checkpoint(tmp.path / "model");
  fs::path out = tmp.path / "trunk";
  ShardSet shards = ShardSet::open(model);
  k3::io::pack_trunk(shards, 3, out);
  const PackedTrunk good = PackedTrunk::open(out, 3);
  std::string j = slurp(out / "trunk.json");
  const std::string from = "\"layer\":2,\"file_off\":" + std::to_string(good.layer(2).file_off) + "," +
                           "\"nbytes\":" + std::to_string(good.layer(2).nbytes) + ",";
  const size_t at = j.find(from);
  REQUIRE(at != std::string::npos);
  j.replace(at, from.size(), "\"layer\":2,\"file_off\":18446744073709547520,\"nbytes\":8192,");
  std::ofstream(out / "trunk.json", std::ios::trunc) << j;
  const std::string m = error_of([&] { PackedTrunk::open(out, 3); });
  CHECK(m.find("layer 2") != std::string::npos);
  CHECK(m.find("runs past the end") != std::string::npos);
}

TEST_CASE("a source shard without header_xxh64 is refused naming trunk.json and the field") {
  // Fuzzing finding: the missing key's lookup was converted to an element, which threw simdjson's
  // own exception ("The JSON field referenced does not exist in this object") out of open().
  TempDir tmp(fs::current_path(), "k3_packed_trunk_");  // the build directory: real disk
  fs::path model = make_checkpoint(tmp.path / "model");
  fs::path out = tmp.path / "trunk";
  k3::io::pack_trunk(ShardSet::open(model), 3, out);
  std::string j = slurp(out / "trunk.json");
  const size_t at = j.find("\"header_xxh64\":");
  REQUIRE(at != std::string::npos);
  j.replace(at, 15, "\"header_xxh63\":");
  std::ofstream(out / "trunk.json", std::ios::trunc) << j;
  const std::string m = error_of([&] { PackedTrunk::open(out, 3); });
  CHECK(m.find("trunk.json") != std::string::npos);
  CHECK(m.find("header_xxh64 is missing or not a string") != std::string::npos);
}

TEST_CASE(
    "a compressed pack decodes to the raw pack's bytes; a flipped byte is refused by layer and offset") {
  TempDir tmp(fs::current_path(), "k3_packed_trunk_");  // the build directory: real disk
  fs::path model = make_checkpoint(tmp.path / "model");
  ShardSet shards = ShardSet::open(model);
  const fs::path raw = tmp.path / "raw";
  k3::io::pack_trunk(shards, 3, raw);
  const PackedTrunk plain = PackedTrunk::open(raw, 3);
  for (auto codec : {k3::io::codec::Codec::exp4, k3::io::codec::Codec::exp3, k3::io::codec::Codec::huff}) {
    CAPTURE(k3::io::codec::codec_name(codec));
    const fs::path out = tmp.path / k3::io::codec::codec_name(codec);
    const k3::io::PackStats st = k3::io::pack_trunk(shards, 3, out, {}, nullptr, codec);
    CHECK(st.raw_bytes == fs::file_size(raw / "trunk.bin"));
    CHECK(st.bytes_written == fs::file_size(out / "trunk.bin"));
    {
      const PackedTrunk t = PackedTrunk::open(out, 3);
      CHECK(t.codec() == codec);
      for (const auto& L : t.layers()) {
        CAPTURE(L.layer);
        CHECK(L.file_off % 4096 == 0);
        CHECK(L.stored_bytes % 4096 == 0);
        CHECK(L.compressed_bytes <= L.stored_bytes);
        CHECK(L.nbytes == plain.layer(L.layer).nbytes);
        CHECK(L.tensors.size() == plain.layer(L.layer).tensors.size());
        CHECK_NOTHROW(t.verify_layer(L.layer));
        std::vector<std::byte> stored(L.stored_bytes), got(L.nbytes);
        t.file().read_exact(L.file_off, stored);
        t.decode_layer(L.layer, stored, got);
        CHECK(got == read_file_range(raw / "trunk.bin", plain.layer(L.layer).file_off, L.nbytes));
      }
    }
    // One flipped byte in the middle of layer 2's stream.
    const PackedTrunk t = PackedTrunk::open(out, 3);
    const uint64_t at = t.layer(2).file_off + t.layer(2).compressed_bytes / 2;
    {
      std::fstream f(out / "trunk.bin", std::ios::binary | std::ios::in | std::ios::out);
      f.seekg(std::streamoff(at));
      char ch = 0;
      f.get(ch);
      f.seekp(std::streamoff(at));
      f.put(char(ch ^ 0x40));
    }
    const PackedTrunk bad = PackedTrunk::open(out, 3);
    CHECK_NOTHROW(bad.verify_layer(1));
    std::string m;
    try {
      bad.verify_layer(2);
    } catch (const k3::io::Error& e) {
      m = e.what();
    }
    CAPTURE(m);
    CHECK(m.find("trunk.bin layer 2: block") != std::string::npos);
    const size_t p = m.find("(bytes ");
    REQUIRE(p != std::string::npos);
    const uint64_t lo = std::stoull(m.substr(p + 7)), hi = std::stoull(m.substr(m.find("..", p) + 2));
    CHECK(lo <= at);  // the range names trunk.bin offsets
    CHECK(at < hi);
  }
}

TEST_CASE("trunk.json with an unknown codec is refused") {
  TempDir tmp(fs::current_path(), "k3_packed_trunk_");
  fs::path model = make_checkpoint(tmp.path / "model");
  const fs::path out = tmp.path / "t";
  k3::io::pack_trunk(ShardSet::open(model), 3, out, {}, nullptr, k3::io::codec::Codec::exp4);
  std::string text;
  {
    std::ifstream f(out / "trunk.json", std::ios::binary);
    text.assign(std::istreambuf_iterator<char>(f), {});
  }
  const size_t at = text.find("\"codec\":\"exp4\"");
  REQUIRE(at != std::string::npos);
  text.replace(at, 14, "\"codec\":\"zstd\"");
  std::ofstream(out / "trunk.json", std::ios::binary | std::ios::trunc) << text;
  std::string m;
  try {
    PackedTrunk::open(out, 3);
  } catch (const k3::io::Error& e) {
    m = e.what();
  }
  CHECK(m.find("unknown codec \"zstd\"") != std::string::npos);
}
