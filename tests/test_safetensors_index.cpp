// The compact tensor index: front-coding edge cases, and the real scale - a header-only (sparse)
// replica of all 96 shards with the 497,220 real tensor names, indexed in <= 100 bytes per tensor.
#include <doctest/doctest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "io/k3_names.hpp"
#include "io/safetensors.hpp"
#include "io/safetensors_index.hpp"
#include "io/safetensors_writer.hpp"

using namespace k3::io;
namespace fs = std::filesystem;

namespace {

TensorInfo info(uint32_t shard, uint64_t offset, std::vector<uint64_t> shape, DType d = DType::BF16) {
  TensorInfo t{};
  t.dtype = d;
  t.rank = static_cast<uint8_t>(shape.size());
  t.shape = {1, 1, 1, 1};
  for (size_t i = 0; i < shape.size(); ++i) t.shape[i] = shape[i];
  t.shard = shard;
  t.offset = offset;
  t.nbytes = t.numel() * dtype_size(d);
  return t;
}

bool same(const TensorInfo& a, const TensorInfo& b) {
  return a.dtype == b.dtype && a.rank == b.rank && a.shape == b.shape && a.shard == b.shard &&
         a.offset == b.offset && a.nbytes == b.nbytes;
}

}  // namespace

TEST_CASE("front-coded index: prefixes, restarts, bytes >= 0x80, large values") {
  std::vector<std::string> names = {"", "a", "aa", "aaa", "ab", "b", std::string("b\0c", 3), "ba"};
  for (int i = 0; i < 40; ++i) names.push_back("layer." + std::to_string(i) + ".weight");
  names.push_back("\xc3\xa9t\xc3\xa9");  // sorts after ASCII (bytes compare unsigned)
  names.push_back(std::string(300, 'x'));
  names.push_back(std::string(300, 'x') + "y");
  std::sort(names.begin(), names.end());
  names.erase(std::unique(names.begin(), names.end()), names.end());
  REQUIRE(names.size() > 2 * TensorIndex::kRestartInterval + 1);

  TensorIndex::Builder b;
  b.reserve(names.size(), 4096);
  std::vector<TensorInfo> infos;
  for (size_t i = 0; i < names.size(); ++i) {
    const std::vector<uint64_t> dims = {i + 1, 3, uint64_t{1} << 40, 2};
    infos.push_back(info(static_cast<uint32_t>(i * 7), (uint64_t{1} << 62) + i,
                         std::vector<uint64_t>(dims.begin(), dims.begin() + static_cast<ptrdiff_t>(i % 5)),
                         static_cast<DType>(i % 4)));
  }
  infos[0] = info(0, 0, {});                                                  // rank 0
  infos[1] = info(65535, UINT64_MAX >> 1, {1ull << 40, 7, 1, 9}, DType::U8);  // rank 4, big dims
  for (size_t i = 0; i < names.size(); ++i) b.add(names[i], infos[i]);
  CHECK_THROWS(b.add("a", infos[0]));  // out of order
  const TensorIndex idx = b.finish();
  CHECK(idx.size() == names.size());
  for (size_t i = 0; i < names.size(); ++i) {
    CAPTURE(i);
    const auto t = idx.find(names[i]);
    REQUIRE(t.has_value());
    CHECK(same(*t, infos[i]));
  }
  for (const std::string& absent : {std::string("0"), std::string("a0"), std::string("aab"),
                                    std::string("layer."), std::string("layer.1"), std::string("zzz"),
                                    std::string("\xff"), std::string(301, 'x'), std::string("b\0", 2)}) {
    CHECK_MESSAGE(!idx.find(absent).has_value(), absent);
  }
  // Near misses of every name (a byte shorter, longer, or its last byte one off either way) against
  // the sorted list: the lookup compares front-coded records without rebuilding them.
  for (const std::string& name : names) {
    std::vector<std::string> near = {name + std::string(1, '\0'), name + "z"};
    if (!name.empty()) {
      near.push_back(name.substr(0, name.size() - 1));
      for (const int d : {-1, 1}) {
        std::string t = name;
        t.back() = static_cast<char>(static_cast<unsigned char>(t.back()) + d);
        near.push_back(t);
      }
    }
    for (const std::string& q : near) {
      CAPTURE(q);
      CHECK(idx.find(q).has_value() == std::binary_search(names.begin(), names.end(), q));
    }
  }
  size_t n = 0;
  idx.for_each([&](std::string_view name, const TensorInfo& t) {
    CHECK(name == names[n]);
    CHECK(same(t, infos[n]));
    ++n;
  });
  CHECK(n == names.size());
  CHECK(idx.heap_bytes() > 0);

  const TensorIndex empty = TensorIndex::Builder().finish();
  CHECK(empty.size() == 0);
  CHECK(!empty.find("").has_value());
}

TEST_CASE("real scale: 497,220 real tensor names in 96 sparse shards, index <= 100 bytes per tensor") {
  using clock = std::chrono::steady_clock;
  const fs::path dir = fs::temp_directory_path() / ("k3_real_index_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  struct Cleanup {
    fs::path p;
    ~Cleanup() { fs::remove_all(p); }
  } cleanup{dir};

  // Header written, data section only declared with ftruncate: ~110 MB on disk for 1.56 TB.
  const auto t0 = clock::now();
  std::vector<std::vector<uint64_t>> offsets(kK3Shards);
  std::vector<uint64_t> data_start(kK3Shards);
  uint64_t apparent = 0, allocated = 0;
  for (uint32_t s = 0; s < kK3Shards; ++s) {
    SafetensorsWriter w(dir / k3_shard_file_name(s), k3_shard_tensors(s), {});
    offsets[s] = w.layout().offsets;
    data_start[s] = w.layout().data_start();
    w.finish_sparse();
    w.commit();
    struct stat st {};
    REQUIRE(::stat((dir / k3_shard_file_name(s)).c_str(), &st) == 0);
    apparent += static_cast<uint64_t>(st.st_size);
    allocated += static_cast<uint64_t>(st.st_blocks) * 512;
  }
  CHECK(apparent == kK3CheckpointBytes);
  const auto t1 = clock::now();

  const ShardSet set = ShardSet::open(dir);
  const auto t2 = clock::now();
  REQUIRE(set.tensor_count() == kK3Tensors);
  REQUIRE(set.shard_count() == kK3Shards);
  for (uint32_t s = 0; s < kK3Shards; ++s) {
    CHECK(set.shard_path(s).filename() == k3_shard_file_name(s));
    CHECK(set.shard_size(s) == k3_published_shard_bytes(s));
  }
  const double per_tensor = double(set.index_bytes()) / double(set.tensor_count());
  MESSAGE("index: " << set.index_bytes() << " bytes for " << set.tensor_count() << " tensors = " << per_tensor
                    << " B/tensor; write " << std::chrono::duration<double>(t1 - t0).count() << " s ("
                    << allocated / 1000000 << " MB on disk), open "
                    << std::chrono::duration<double>(t2 - t1).count() << " s");
  CHECK(per_tensor <= 100.0);

  // Every tensor of the canonical list is found with its dtype, shape, shard and offset.
  size_t checked = 0;
  std::string first, last;
  for (uint32_t s = 0; s < kK3Shards; ++s) {
    const std::vector<TensorEntry> tensors = k3_shard_tensors(s);
    for (size_t i = 0; i < tensors.size(); ++i) {
      const TensorEntry& e = tensors[i];
      const auto t = set.find(e.name);
      if (!t) FAIL("missing " << e.name);
      bool ok = t->dtype == e.dtype && t->rank == e.shape.size() && t->shard == s &&
                t->offset == data_start[s] + offsets[s][i] && t->nbytes == e.nbytes();
      for (size_t k = 0; k < e.shape.size(); ++k) ok = ok && t->shape[k] == e.shape[k];
      if (!ok) FAIL("wrong entry for " << e.name);
      if (first.empty() || e.name < first) first = e.name;
      if (e.name > last) last = e.name;
      ++checked;
    }
  }
  CHECK(checked == kK3Tensors);

  // First, last, middle and absent names; one expert is six adjacent tensors of 17,547,264 bytes.
  std::vector<std::string> sorted_sample;
  size_t n = 0;
  std::string prev;
  bool ordered = true;
  set.for_each([&](std::string_view name, const TensorInfo&) {
    if (n > 0 && !(prev < name)) ordered = false;
    prev.assign(name);
    if (n == 0 || n == kK3Tensors / 2 || n + 1 == kK3Tensors) sorted_sample.emplace_back(name);
    ++n;
  });
  CHECK(n == kK3Tensors);
  CHECK(ordered);
  REQUIRE(sorted_sample.size() == 3);
  CHECK(sorted_sample[0] == first);
  CHECK(sorted_sample[2] == last);
  for (const std::string& name : sorted_sample) CHECK(set.find(name).has_value());
  CHECK(set.find("language_model.lm_head.weight")->nbytes == 2'348'810'240ull);
  const std::string x = "language_model.model.layers.45.block_sparse_moe.experts.123.";
  uint64_t expert = 0, end = set.find(x + "w1.weight_packed")->offset;
  for (const char* t : {"w1.weight_packed", "w1.weight_scale", "w2.weight_packed", "w2.weight_scale",
                        "w3.weight_packed", "w3.weight_scale"}) {
    const auto i = set.find(x + t);
    REQUIRE(i.has_value());
    CHECK(i->shard == 45);
    CHECK(i->offset == end);
    end += i->nbytes;
    expert += i->nbytes;
  }
  CHECK(expert == kK3ExpertBytes);
  for (const std::string& absent :
       {std::string("language_model.model.layers.93.input_layernorm.weight"),
        std::string("language_model.model.layers.1.block_sparse_moe.experts.896.w1.weight_packed"),
        std::string("language_model.model.layers.3.self_attn.q_proj.weight"),  // layer 3 is MLA
        std::string("language_model.model.layers.1.mlp.gate_proj.weight"),
        std::string("language_model.model."), first.substr(0, first.size() - 1), last + ".",
        std::string("")}) {
    CHECK_MESSAGE(!set.find(absent).has_value(), absent);
  }
  // Reads inside the sparse data section return zeros.
  std::vector<std::byte> b(64, std::byte{1});
  set.read_range(93, set.find("language_model.model.norm.weight")->offset, b);
  CHECK(std::all_of(b.begin(), b.end(), [](std::byte v) { return v == std::byte{0}; }));
}
