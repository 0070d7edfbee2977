// stages/bind.*: refusals naming the tensor, dtype forms (BF16 / F16 / misaligned F32 bind to the
// same bits as F32), and the MXFP4 expert checks. Checkpoints are rewritten from fixtures/tiny-k3
// with io::SafetensorsWriter into temporary directories.
#include <doctest/doctest.h>
#include <unistd.h>

#include <bit>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "io/config.hpp"
#include "io/error.hpp"
#include "io/safetensors.hpp"
#include "io/safetensors_writer.hpp"
#include "io/widen.hpp"
#include "stages/bind.hpp"
#include "stages/forward.hpp"
#include "tests/fixture_json.hpp"
#include "tests/temp_dir.hpp"

namespace fs = std::filesystem;
using k3::test::TempDir;
using namespace k3;

namespace {

struct Tensor {
  io::TensorEntry entry;
  std::vector<std::byte> bytes;
};

std::vector<Tensor> tiny_tensors() {
  const io::ShardSet shards = io::ShardSet::open(test::fixture_path("tiny-k3"));
  std::vector<Tensor> out;
  shards.for_each([&](std::string_view name, const io::TensorInfo& t) {
    Tensor x;
    x.entry.name = std::string(name);
    x.entry.dtype = t.dtype;
    x.entry.shape.assign(t.shape.begin(), t.shape.begin() + t.rank);
    x.bytes.resize(t.nbytes);
    shards.read(t, x.bytes);
    out.push_back(std::move(x));
  });
  return out;
}

void write_checkpoint(const fs::path& dir, const std::vector<Tensor>& tensors,
                      const std::string& config_json = "") {
  fs::create_directories(dir);
  if (config_json.empty()) {
    fs::copy_file(test::fixture_path("tiny-k3/config.json"), dir / "config.json");
  } else {
    std::FILE* f = std::fopen((dir / "config.json").c_str(), "w");
    std::fputs(config_json.c_str(), f);
    std::fclose(f);
  }
  std::vector<io::TensorEntry> entries;
  for (const Tensor& t : tensors) entries.push_back(t.entry);
  io::SafetensorsWriter w(dir / "model-00001-of-000001.safetensors", entries);
  for (const Tensor& t : tensors) w.append(t.bytes);
  w.finish();
  w.commit();
}

Tensor* find(std::vector<Tensor>& ts, const std::string& name) {
  for (Tensor& t : ts)
    if (t.entry.name == name) return &t;
  FAIL("no tensor " << name);
  return nullptr;
}

float f32_at(const Tensor& t, size_t i) {
  float v;
  std::memcpy(&v, t.bytes.data() + 4 * i, 4);
  return v;
}

// Round-to-nearest-even f32 -> bf16 (finite values).
uint16_t to_bf16(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

// Every value rounded to bf16; stored as BF16 when `as_bf16`, else as F32 holding the same values.
void round_to_bf16(std::vector<Tensor>& ts, bool as_bf16) {
  for (Tensor& t : ts) {
    const size_t n = t.bytes.size() / 4;
    std::vector<std::byte> out(n * (as_bf16 ? 2 : 4));
    for (size_t i = 0; i < n; ++i) {
      const uint16_t b = to_bf16(f32_at(t, i));
      if (as_bf16) {
        std::memcpy(out.data() + 2 * i, &b, 2);
      } else {
        const float w = std::bit_cast<float>(static_cast<uint32_t>(b) << 16);
        std::memcpy(out.data() + 4 * i, &w, 4);
      }
    }
    t.bytes = std::move(out);
    if (as_bf16) t.entry.dtype = io::DType::BF16;
  }
}

std::vector<float> last_logits(const fs::path& dir, const std::vector<int32_t>& ids) {
  const io::ModelConfig c = io::load_config(dir / "config.json");
  const io::ShardSet shards = io::ShardSet::open(dir);
  const auto model = stages::ResidentModel::load(shards, c);
  stages::DecodeState st(c, model->bound_layers(), ids.size());
  stages::Scratch sc;
  std::vector<float> lg(static_cast<size_t>(c.vocab));
  stages::forward(*model, st, ids, stages::HeadAt::last, lg, sc);
  return lg;
}

const std::vector<int32_t> kIds = {203, 34, 2, 239, 195, 71, 163, 54, 121, 104, 16, 16, 219, 63};

void expect_refusal(const std::vector<Tensor>& ts, const std::string& message) {
  TempDir d;
  write_checkpoint(d.path / "m", ts);
  const io::ModelConfig c = io::load_config(d.path / "m" / "config.json");
  const io::ShardSet shards = io::ShardSet::open(d.path / "m");
  CHECK_THROWS_WITH_AS(stages::ResidentModel::load(shards, c), doctest::Contains(message.c_str()), io::Error);
}

}  // namespace

TEST_CASE("missing, mis-sized and mis-shaped tensors are refused by name") {
  {
    auto ts = tiny_tensors();
    std::erase_if(ts, [](const Tensor& t) {
      return t.entry.name == "language_model.model.layers.5.self_attn.dt_bias";
    });
    expect_refusal(ts, "missing tensor language_model.model.layers.5.self_attn.dt_bias");
  }
  {
    auto ts = tiny_tensors();
    std::erase_if(ts, [](const Tensor& t) { return t.entry.name == "language_model.lm_head.weight"; });
    expect_refusal(ts, "missing tensor language_model.lm_head.weight");
  }
  {
    auto ts = tiny_tensors();
    std::erase_if(ts, [](const Tensor& t) {
      return t.entry.name == "language_model.model.layers.12.block_sparse_moe.experts.3.w2.weight";
    });
    expect_refusal(ts, "missing tensor language_model.model.layers.12.block_sparse_moe.experts.3.w2.weight");
  }
  {
    auto ts = tiny_tensors();
    Tensor* t = find(ts, "language_model.model.layers.3.self_attn.kv_b_proj.weight");
    t->entry.shape = {160, 31};
    t->bytes.resize(160 * 31 * 4);
    expect_refusal(
        ts,
        "language_model.model.layers.3.self_attn.kv_b_proj.weight has 4960 elements, engine expects 5120");
  }
  {
    auto ts = tiny_tensors();
    Tensor* t = find(ts, "language_model.model.layers.1.self_attn.A_log");  // neither H (4) nor D (16)
    t->entry.shape = {5};
    t->bytes.resize(5 * 4);
    expect_refusal(ts, "language_model.model.layers.1.self_attn.A_log has 5 elements, engine expects 16");
  }
  {
    auto ts = tiny_tensors();
    Tensor* t = find(ts, "language_model.model.layers.2.block_sparse_moe.routed_expert_norm.weight");
    t->entry.dtype = io::DType::U8;
    t->entry.shape = {256};
    expect_refusal(ts, "routed_expert_norm.weight is U8");
  }
  {
    // Declared transposed: the right element count, the wrong layout.
    auto ts = tiny_tensors();
    Tensor* t = find(ts, "language_model.model.layers.3.self_attn.kv_b_proj.weight");
    t->entry.shape = {t->entry.shape[1], t->entry.shape[0]};
    expect_refusal(
        ts,
        "language_model.model.layers.3.self_attn.kv_b_proj.weight is [32, 160], engine expects [160, 32]");
  }
}

TEST_CASE("BF16 storage binds to the same bits as F32 holding the same values; F16 vectors widen exactly") {
  TempDir d;
  auto as_f32 = tiny_tensors(), as_bf16 = tiny_tensors();
  round_to_bf16(as_f32, false);
  round_to_bf16(as_bf16, true);
  // Gains of 1.0 are exact in F16: store two of them that way.
  for (const char* name :
       {"language_model.model.norm.weight", "language_model.model.layers.0.input_layernorm.weight"}) {
    Tensor* t = find(as_bf16, name);
    t->entry.dtype = io::DType::F16;
    for (size_t i = 0; i < t->bytes.size() / 2; ++i) {
      const uint16_t one = 0x3c00;
      std::memcpy(t->bytes.data() + 2 * i, &one, 2);
    }
  }
  write_checkpoint(d.path / "f32", as_f32);
  write_checkpoint(d.path / "bf16", as_bf16);
  const auto a = last_logits(d.path / "f32", kIds), b = last_logits(d.path / "bf16", kIds);
  CHECK(std::memcmp(a.data(), b.data(), a.size() * 4) == 0);
}

TEST_CASE("the kernels read BF16 weights in place with the same map io widens them with") {
  // A BF16 matrix is bound in place and read by kernels::bf16_to_f32; vectors and misaligned
  // tensors are widened by io::widen_to_f32 (tested exhaustively in test_safetensors). Both must
  // give the same bits for every pattern, or a tensor would change value with its alignment.
  for (uint32_t b = 0; b < 0x10000; ++b)
    if (std::bit_cast<uint32_t>(kernels::bf16_to_f32(uint16_t(b))) !=
        std::bit_cast<uint32_t>(io::bf16_to_f32(uint16_t(b))))
      FAIL("bf16 " << b);
}

TEST_CASE("a misaligned F32 run (odd-sized tensor first) binds through the widen area to the golden bits") {
  TempDir d;
  auto ts = tiny_tensors();
  Tensor odd;
  odd.entry = {"aaa.unused.odd", io::DType::BF16, {3}};
  odd.bytes.resize(6);
  ts.insert(ts.begin(), odd);
  write_checkpoint(d.path / "m", ts);
  const io::ModelConfig c = io::load_config(d.path / "m" / "config.json");
  const io::ShardSet shards = io::ShardSet::open(d.path / "m");
  const stages::Layout lay = stages::locate(stages::layer_tensors(c, 1).tensors, shards, c);
  CHECK(lay.base_mod8 % 4 != 0);
  CHECK(lay.widen_floats > 0);
  std::vector<int32_t> full = kIds;
  for (int32_t id : {4, 31, 48, 193, 57, 231, 219, 205, 145, 117, 79, 208, 18, 1, 74, 125, 66, 121})
    full.push_back(id);
  const auto lg = last_logits(d.path / "m", full);
  std::vector<float> golden(256);
  std::FILE* f = std::fopen(test::fixture_path("golden/tiny_c_logits.bin").c_str(), "rb");
  REQUIRE(f);
  REQUIRE(std::fread(golden.data(), 4, 256, f) == 256);
  std::fclose(f);
  CHECK(std::memcmp(lg.data(), golden.data(), 1024) == 0);
}

TEST_CASE("bind_layer checks its buffer: size, widen area, address alignment") {
  const io::ModelConfig c = io::load_config(test::fixture_path("tiny-k3/config.json"));
  const io::ShardSet shards = io::ShardSet::open(test::fixture_path("tiny-k3"));
  const stages::Layout lay = stages::locate(stages::layer_tensors(c, 3).tensors, shards, c);
  io::AlignedBuffer buf(lay.buffer_bytes + 16);
  std::span<std::byte> bytes = buf.bytes().subspan(lay.base_mod8, lay.buffer_bytes);
  stages::read_layout(lay, shards, bytes);
  std::vector<float> widen(lay.widen_floats);
  const stages::LayerWeights w = stages::bind_layer(c, 3, lay, bytes, widen);
  CHECK(std::holds_alternative<stages::MlaWeights>(w.attn));
  CHECK(std::get<stages::MlaWeights>(w.attn).g.has_value());
  CHECK(std::holds_alternative<kernels::F32Matrix>(std::get<stages::MlaWeights>(w.attn).q_b));
  CHECK_THROWS_AS(stages::bind_layer(c, 3, lay, bytes.first(lay.buffer_bytes - 1), widen), io::Error);
  CHECK_THROWS_AS(
      stages::bind_layer(c, 3, lay, buf.bytes().subspan(lay.base_mod8 + 1, lay.buffer_bytes), widen),
      io::Error);
  if (lay.widen_floats > 0)
    CHECK_THROWS_AS(stages::bind_layer(c, 3, lay, bytes, std::span<float>(widen).first(lay.widen_floats - 1)),
                    io::Error);
}

TEST_CASE("MXFP4 experts: U8, 2-D, equal rows, group size 32, shape as configured") {
  io::ModelConfig c = io::load_config(test::fixture_path("tiny-k3/config.json"));
  c.latent = 64;
  c.moe_inter = 64;  // tiny's 48 is not a multiple of the 32-element group
  auto u8 = [](std::string name, std::vector<uint64_t> shape) {
    Tensor t;
    t.entry = {std::move(name), io::DType::U8, std::move(shape)};
    t.bytes.assign(t.entry.nbytes(), std::byte{0x21});
    return t;
  };
  const std::string X = stages::expert_prefix(1, 0);
  auto valid = [&] {
    std::vector<Tensor> ts;
    for (const char* w : {"w1", "w2", "w3"}) {
      ts.push_back(u8(X + w + ".weight_packed", {64, 32}));
      ts.push_back(u8(X + w + ".weight_scale", {64, 2}));
    }
    return ts;
  };
  auto check = [&](const std::vector<Tensor>& ts, const std::string& message) {
    TempDir d;
    write_checkpoint(d.path / "m", ts);
    const io::ShardSet shards = io::ShardSet::open(d.path / "m");
    if (message.empty()) {
      const stages::Layout lay = stages::locate_expert(shards, c, 1, 0);
      CHECK(lay.contiguous);
      CHECK(lay.buffer_bytes == 3 * (64 * 32 + 64 * 2));
      std::vector<std::byte> bytes(lay.buffer_bytes + 8);
      std::span<std::byte> span(
          bytes.data() + (8 - reinterpret_cast<uintptr_t>(bytes.data()) % 8 + lay.base_mod8) % 8,
          lay.buffer_bytes);
      stages::read_layout(lay, shards, span);
      const stages::ExpertWeights e = stages::bind_expert(c, lay, span, {});
      const auto& w2 = std::get<kernels::Mxfp4Matrix>(e.w2);
      CHECK(w2.rows == 64);
      CHECK(w2.cols == 64);
      CHECK(w2.packed.size() == 64 * 32);
      CHECK(w2.scales.size() == 64 * 2);
    } else {
      CHECK_THROWS_WITH_AS(stages::locate_expert(shards, c, 1, 0), doctest::Contains(message.c_str()),
                           io::Error);
    }
  };
  check(valid(), "");
  {
    auto ts = valid();
    ts[2].entry.dtype = io::DType::F32;  // w2.weight_packed
    ts[2].bytes.resize(ts[2].entry.nbytes());
    check(ts, "w2.weight_packed is F32, engine expects U8");
  }
  {
    auto ts = valid();
    ts[0].entry.shape = {64 * 32};
    check(ts, "must be 2-D");
  }
  {
    auto ts = valid();
    ts[1].entry.shape = {32, 4};  // scale rows != packed rows
    check(ts, "rows");
  }
  {
    auto ts = valid();
    ts[4].entry.shape = {32, 64};  // w3 packed transposed: rows disagree with the scale
    check(ts, "rows");
  }
  {
    auto ts = valid();
    ts[5].entry.shape = {64, 3};
    ts[5].bytes.resize(64 * 3);
    check(ts, "w3.weight_scale has 192 elements, engine expects 128");
  }
  {
    auto ts = valid();
    ts.erase(ts.begin() + 3);  // w2.weight_scale
    check(ts, "missing tensor " + X + "w2.weight_scale");
  }
}

TEST_CASE("place(): binding a layer from bytes packed elsewhere (a trunk slot) gives the same weights") {
  const io::ModelConfig c = io::load_config(test::fixture_path("tiny-k3/config.json"));
  const io::ShardSet shards = io::ShardSet::open(test::fixture_path("tiny-k3"));
  for (int l : {0, 1, 3}) {
    CAPTURE(l);
    const stages::LayerTensors layer = stages::layer_tensors(c, l);
    // Pack the layer the way a trunk file might: reversed order, 64-aligned, after a 4096-byte gap.
    std::vector<stages::Placement> packed;
    uint64_t pos = 4096;
    for (auto it = layer.tensors.rbegin(); it != layer.tensors.rend(); ++it) {
      const io::TensorInfo t = *shards.find(it->name);
      packed.push_back({t, io::align_up(pos, 64)});
      pos = packed.back().offset + t.nbytes;
    }
    io::AlignedBuffer slot(pos);
    for (const auto& p : packed) shards.read(p.info, slot.bytes().subspan(p.offset, p.info.nbytes));
    const stages::PlacementLookup lookup = [&](const std::string& name) -> std::optional<stages::Placement> {
      for (size_t i = 0; i < layer.tensors.size(); ++i)
        if (layer.tensors[layer.tensors.size() - 1 - i].name == name) return packed[i];
      return std::nullopt;
    };
    const stages::Layout lay = stages::place(layer.tensors, lookup, c, pos);
    CHECK(lay.widen_floats > 0);  // the vectors
    std::vector<float> widen(lay.widen_floats);
    const stages::LayerWeights a = stages::bind_layer(c, l, lay, slot.bytes().first(pos), widen);

    const stages::Layout ref_lay = stages::locate(layer.tensors, shards, c);
    io::AlignedBuffer ref(ref_lay.buffer_bytes + 8);
    const auto ref_bytes = ref.bytes().subspan(ref_lay.base_mod8, ref_lay.buffer_bytes);
    stages::read_layout(ref_lay, shards, ref_bytes);
    std::vector<float> ref_widen(ref_lay.widen_floats);
    const stages::LayerWeights b = stages::bind_layer(c, l, ref_lay, ref_bytes, ref_widen);

    auto same = [](std::span<const float> x, std::span<const float> y) {
      return x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size() * 4) == 0;
    };
    auto data = [](const kernels::Matrix& m) { return std::get<kernels::F32Matrix>(m).data; };
    CHECK(same(a.input_norm, b.input_norm));
    CHECK(same(a.mlp_res_proj, b.mlp_res_proj));
    if (l == 3) {
      CHECK(same(data(std::get<stages::MlaWeights>(a.attn).kv_b),
                 data(std::get<stages::MlaWeights>(b.attn).kv_b)));
    } else {
      const auto& ka = std::get<stages::KdaWeights>(a.attn);
      const auto& kb = std::get<stages::KdaWeights>(b.attn);
      CHECK(same(data(ka.q), data(kb.q)));
      CHECK(same(ka.a_log, kb.a_log));
      CHECK(ka.a_log.size() == 4);
      CHECK(same(ka.k_conv, kb.k_conv));
    }
    // A tensor that would end past the buffer is refused by name.
    CHECK_THROWS_WITH_AS(stages::place(layer.tensors, lookup, c, pos - 1), doctest::Contains("-byte buffer"),
                         io::Error);
  }
}
