// io/synth/synth.* and `k3flow synth`: what is written is what was asked for (dims, names, dtypes,
// shapes, layout), values are valid and well scaled, runs are reproducible, refusals name the
// flag, and a failed run leaves nothing behind.
#include <doctest/doctest.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <signal.h>
#include <simdjson.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <bit>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "io/config.hpp"
#include "io/safetensors.hpp"
#include "io/synth/synth.hpp"
#include "tests/run_helpers.hpp"

namespace fs = std::filesystem;
using k3::io::DType;

namespace {

using k3::test::Run;
using k3::test::slurp;
using k3::test::TempDir;

// Runs the real binary with `args` (shell words) and `env` (NAME=VALUE words), capturing stdout and
// stderr.
Run k3flow(const std::string& args, const std::string& env = "") {
  return k3::test::k3flow_sh(args, env);
}

// Dims deliberately unlike any preset, so a default leaking through would show.
const char* kDims =
    "--layers 6 --hidden 96 --vocab 300 --heads 3 --head-dim 16 --mla-heads 2 --q-lora 40 --kv-lora 24 "
    "--qk-nope 16 --qk-rope 8 --v-head 12 --experts 12 --top-k 3 --shared 2 --latent 64 --moe-inter 96 "
    "--dense-inter 80 --block-size 2 --full-attn 3,6 --first-dense 1";

k3::io::ModelConfig expected_dims() {
  k3::io::ModelConfig c = k3::io::synth::preset_dims("tiny");
  c.n_layers = 6, c.hidden = 96, c.vocab = 300, c.kda_heads = 3, c.kda_head_dim = 16, c.mla_heads = 2;
  c.q_lora_rank = 40, c.kv_lora_rank = 24, c.qk_nope = 16, c.qk_rope = 8, c.v_head = 12;
  c.n_experts = 12, c.top_k = 3, c.n_shared = 2, c.latent = 64, c.moe_inter = 96, c.dense_inter = 80;
  c.attn_res_block = 2, c.full_attn_layers = {3, 6}, c.first_dense = 1;
  return c;
}

std::vector<std::byte> read_tensor(const k3::io::ShardSet& set, const std::string& name) {
  auto t = set.find(name);
  REQUIRE_MESSAGE(t.has_value(), name);
  std::vector<std::byte> v(t->nbytes);
  set.read(*t, v);
  return v;
}

std::vector<float> as_floats(const std::vector<std::byte>& b, DType dt) {
  std::vector<float> v;
  if (dt == DType::F32) {
    v.resize(b.size() / 4);
    std::memcpy(v.data(), b.data(), b.size());
  } else {
    for (size_t i = 0; i + 1 < b.size(); i += 2) {
      uint16_t h;
      std::memcpy(&h, &b[i], 2);
      v.push_back(std::bit_cast<float>(uint32_t(h) << 16));
    }
  }
  return v;
}

double rms(const std::vector<float>& v, double center = 0) {
  double s = 0;
  for (float x : v) s += (x - center) * (x - center);
  return std::sqrt(s / v.size());
}

const float kE2M1[16] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6, -0.0f, -0.5f, -1, -1.5f, -2, -3, -4, -6};

}  // namespace

TEST_CASE("synth -> ShardSet round trip: dims, names, dtypes, shapes, layout, values") {
  TempDir dir;
  const fs::path out = dir.path / "ckpt";
  Run r = k3flow(fmt::format("synth {} {} --seed 7", out.string(), kDims));
  REQUIRE_MESSAGE(r.code == 0, r.err);
  CHECK(r.out.find(" GB/s (seed 7)") != std::string::npos);

  const k3::io::ModelConfig want = expected_dims();
  const k3::io::ModelConfig got = k3::io::load_config(out / "config.json");
  CHECK(got.nested);
  CHECK(got.n_layers == want.n_layers);
  CHECK(got.hidden == want.hidden);
  CHECK(got.vocab == want.vocab);
  CHECK(got.kda_heads == want.kda_heads);
  CHECK(got.kda_head_dim == want.kda_head_dim);
  CHECK(got.mla_heads == want.mla_heads);
  CHECK(got.q_lora_rank == want.q_lora_rank);
  CHECK(got.kv_lora_rank == want.kv_lora_rank);
  CHECK(got.qk_nope == want.qk_nope);
  CHECK(got.qk_rope == want.qk_rope);
  CHECK(got.v_head == want.v_head);
  CHECK(got.n_experts == want.n_experts);
  CHECK(got.top_k == want.top_k);
  CHECK(got.n_shared == want.n_shared);
  CHECK(got.latent == want.latent);
  CHECK(got.moe_inter == want.moe_inter);
  CHECK(got.dense_inter == want.dense_inter);
  CHECK(got.attn_res_block == want.attn_res_block);
  CHECK(got.first_dense == want.first_dense);
  CHECK(got.full_attn_layers == want.full_attn_layers);
  CHECK(got.conv_kernel == 4);
  CHECK(got.situ_beta == 4.0f);
  CHECK(got.situ_linear_beta == 25.0f);
  CHECK(got.gate_lower_bound == -5.0f);
  CHECK(got.is_mla(2));
  CHECK(got.is_mla(5));
  CHECK_FALSE(got.is_mla(0));

  // One shard per layer plus the head, named like the released ones.
  const auto plan = k3::io::synth::layout_dense(want, 0);
  REQUIRE(plan.shards.size() == 7);
  CHECK(fs::exists(out / "model-00001-of-000007.safetensors"));
  CHECK(fs::exists(out / "model-00007-of-000007.safetensors"));
  CHECK(fs::exists(out / "model.safetensors.index.json"));
  for (const auto& e : fs::directory_iterator(out)) CHECK(e.path().extension() != ".partial");

  auto set = k3::io::ShardSet::open(out);
  CHECK(set.tensor_count() == plan.tensor_count());
  for (size_t s = 0; s < plan.shards.size(); ++s) {
    for (const auto& t : plan.shards[s].tensors) {
      auto info = set.find(t.entry.name);
      REQUIRE_MESSAGE(info.has_value(), t.entry.name);
      CHECK(info->dtype == t.entry.dtype);
      CHECK(info->rank == t.entry.shape.size());
      for (size_t d = 0; d < t.entry.shape.size(); ++d) CHECK(info->shape[d] == t.entry.shape[d]);
      CHECK(set.shard_path(info->shard).filename() == plan.shards[s].file);
    }
  }
  for (const char* n :
       {"language_model.model.embed_tokens.weight", "language_model.lm_head.weight",
        "language_model.model.norm.weight", "language_model.model.output_attn_res_norm.weight",
        "language_model.model.output_attn_res_proj.weight",
        "language_model.model.layers.0.mlp.gate_proj.weight", "language_model.model.layers.0.self_attn.A_log",
        "language_model.model.layers.2.self_attn.kv_a_proj_with_mqa.weight",
        "language_model.model.layers.1.block_sparse_moe.gate.e_score_correction_bias",
        "language_model.model.layers.5.block_sparse_moe.experts.11.w3.weight_scale"})
    CHECK_MESSAGE(set.find(n).has_value(), n);
  CHECK_FALSE(set.find("language_model.model.layers.0.block_sparse_moe.gate.weight").has_value());
  CHECK_FALSE(set.find("language_model.model.layers.2.self_attn.q_conv1d.weight").has_value());

  SUBCASE("each expert's six tensors are one run, in the released order, of the expected size") {
    const uint64_t I = 96, L = 64, expert_bytes = 3 * I * L / 2 + 3 * I * L / 32;
    const char* order[] = {"w1.weight_packed", "w1.weight_scale",  "w2.weight_packed",
                           "w2.weight_scale",  "w3.weight_packed", "w3.weight_scale"};
    for (int l = 1; l < 6; ++l) {
      for (int e = 0; e < 12; ++e) {
        uint64_t next = 0, sum = 0;
        uint32_t shard = 0;
        for (int i = 0; i < 6; ++i) {
          auto t = set.find(
              fmt::format("language_model.model.layers.{}.block_sparse_moe.experts.{}.{}", l, e, order[i]));
          REQUIRE(t.has_value());
          CHECK(t->dtype == DType::U8);
          if (i) CHECK(t->offset == next);
          if (i) CHECK(t->shard == shard);
          shard = t->shard, next = t->offset + t->nbytes, sum += t->nbytes;
        }
        CHECK(sum == expert_bytes);
      }
    }
    auto w2 = set.find("language_model.model.layers.1.block_sparse_moe.experts.0.w2.weight_packed");
    CHECK(w2->shape[0] == L);
    CHECK(w2->shape[1] == I / 2);
  }

  SUBCASE("each layer's trunk tensors are one contiguous run") {
    for (int l = 0; l < 6; ++l) {
      uint64_t lo = UINT64_MAX, hi = 0, sum = 0;
      set.for_each([&](std::string_view name, const k3::io::TensorInfo& t) {
        const std::string p = fmt::format("language_model.model.layers.{}.", l);
        if (!name.starts_with(p) || name.find(".experts.") != std::string_view::npos) return;
        lo = std::min(lo, t.offset), hi = std::max(hi, t.offset + t.nbytes), sum += t.nbytes;
      });
      CHECK(hi - lo == sum);
    }
  }

  SUBCASE(
      "MXFP4: every nibble code occurs, scales cluster in a safe range, dequantised rows are well scaled") {
    const std::string base = "language_model.model.layers.1.block_sparse_moe.experts.3.w1.";
    auto packed = read_tensor(set, base + "weight_packed");
    auto scales = read_tensor(set, base + "weight_scale");
    int seen[16] = {};
    for (std::byte b : packed) ++seen[int(b) & 15], ++seen[int(b) >> 4];
    for (int c = 0; c < 16; ++c) CHECK(seen[c] > 0);
    int lo = 255, hi = 0;
    for (std::byte b : scales) lo = std::min(lo, int(b)), hi = std::max(hi, int(b));
    CHECK(lo >= 100);
    CHECK(hi <= 130);
    CHECK(hi - lo <= 2);
    CHECK(hi != 255);
    // Dequantise (low nibble = even element, scale 2^(b-127) per 32): std ≈ 1/sqrt(fan_in = 64).
    std::vector<float> w;
    const size_t rows = 96, pc = 32, sc = 2;
    for (size_t row = 0; row < rows; ++row)
      for (size_t j = 0; j < pc; ++j) {
        const uint8_t b = uint8_t(packed[row * pc + j]);
        const float s = std::ldexp(1.0f, int(scales[row * sc + (2 * j) / 32]) - 127);
        w.push_back(kE2M1[b & 15] * s);
        w.push_back(kE2M1[b >> 4] * s);
      }
    const double sd = rms(w);
    CHECK(sd > 0.5 / 8);
    CHECK(sd < 2.0 / 8);
  }

  SUBCASE("trunk values: finite, matrices ~N(0, 1/sqrt(fan_in)), gains ~1, A_log per head then zeros") {
    auto q =
        as_floats(read_tensor(set, "language_model.model.layers.0.self_attn.q_proj.weight"), DType::BF16);
    for (float x : q) REQUIRE(std::isfinite(x));
    CHECK(rms(q) == doctest::Approx(1 / std::sqrt(96.0)).epsilon(0.1));
    auto g = as_floats(read_tensor(set, "language_model.model.layers.3.input_layernorm.weight"), DType::BF16);
    CHECK(rms(g, 1.0) < 0.05);
    CHECK(rms(g, 1.0) > 0.0);
    auto a = set.find("language_model.model.layers.1.self_attn.A_log");
    REQUIRE(a.has_value());
    CHECK(a->dtype == DType::F32);
    CHECK(a->numel() == 16);
    auto av = as_floats(read_tensor(set, "language_model.model.layers.1.self_attn.A_log"), DType::F32);
    for (int i = 0; i < 3; ++i) CHECK((av[i] != 0 && av[i] >= -0.5f && av[i] <= 1.0f));
    for (int i = 3; i < 16; ++i) CHECK(av[i] == 0.0f);
    auto bias = set.find("language_model.model.layers.4.block_sparse_moe.gate.e_score_correction_bias");
    CHECK(bias->dtype == DType::F32);
    CHECK(bias->numel() == 12);
  }

  SUBCASE("index.json maps every tensor to its shard, total_size = data bytes") {
    simdjson::dom::parser parser;
    simdjson::dom::element idx = parser.load((out / "model.safetensors.index.json").string());
    CHECK(uint64_t(idx["metadata"]["total_size"]) == plan.data_bytes());
    simdjson::dom::object map = idx["weight_map"];
    CHECK(map.size() == plan.tensor_count());
    for (const auto& s : plan.shards)
      for (const auto& t : s.tensors) CHECK(std::string_view(map[t.entry.name].get_string()) == s.file);
  }
}

TEST_CASE("fill_bytes: any split of a tensor gives the same bytes") {
  k3::io::synth::SynthCheckpoint p = k3::io::synth::layout_dense(k3::io::synth::preset_dims("tiny"), 0);
  for (const auto& t : p.shards[1].tensors) {
    const uint64_t n = t.entry.nbytes();
    std::vector<std::byte> whole(n), parts(n);
    k3::io::synth::fill_bytes(t, 42, 0, whole);
    uint64_t pos = 0, step = 1;
    while (pos < n) {
      const uint64_t len = std::min(n - pos, step);
      k3::io::synth::fill_bytes(t, 42, pos, {parts.data() + pos, len});
      pos += len, step = step * 3 + 1;
    }
    REQUIRE_MESSAGE(whole == parts, t.entry.name);
  }
  // A tensor larger than one generator chunk, split across the chunk boundary at odd offsets.
  k3::io::synth::SynthTensor big{{"big", DType::BF16, {3u << 19}}, -1, -1, k3::io::synth::Fill::normal, 0.1f};
  std::vector<std::byte> whole(big.entry.nbytes()), parts(whole.size());
  k3::io::synth::fill_bytes(big, 1, 0, whole);
  const uint64_t cut1 = k3::io::synth::kFillChunk - 3, cut2 = 2 * k3::io::synth::kFillChunk + 5;
  k3::io::synth::fill_bytes(big, 1, 0, {parts.data(), cut1});
  k3::io::synth::fill_bytes(big, 1, cut1, {parts.data() + cut1, cut2 - cut1});
  k3::io::synth::fill_bytes(big, 1, cut2, {parts.data() + cut2, parts.size() - cut2});
  CHECK(whole == parts);
}

TEST_CASE("same seed, same bytes; another seed, other bytes; packing does not change values") {
  TempDir dir;
  const fs::path a = dir.path / "a", b = dir.path / "b", c = dir.path / "c", d = dir.path / "d";
  REQUIRE(k3flow(fmt::format("synth {} --size tiny --seed 5", a.string())).code == 0);
  REQUIRE(k3flow(fmt::format("synth {} --size tiny --seed 5", b.string())).code == 0);
  REQUIRE(k3flow(fmt::format("synth {} --size tiny --seed 6", c.string())).code == 0);
  REQUIRE(k3flow(fmt::format("synth {} --size tiny --seed 5 --shards 2", d.string())).code == 0);
  size_t files = 0;
  for (const auto& e : fs::directory_iterator(a)) {
    const std::string name = e.path().filename().string();
    ++files;
    CHECK_MESSAGE(slurp(e.path()) == slurp(b / name), name);
    if (name.ends_with(".safetensors")) {
      CHECK_MESSAGE(slurp(e.path()) != slurp(c / name), name);
    } else {
      CHECK(slurp(e.path()) == slurp(c / name));  // config and index do not depend on the seed
    }
  }
  CHECK(files == 9);  // 4 layers + head, config, index, tiktoken.model, tokenizer_config.json
  auto sa = k3::io::ShardSet::open(a), sd = k3::io::ShardSet::open(d);
  CHECK(sd.shard_count() == 2);
  CHECK(sd.tensor_count() == sa.tensor_count());
  int compared = 0;
  sa.for_each([&](std::string_view name, const k3::io::TensorInfo& t) {
    if (compared++ % 17) return;
    auto u = sd.find(name);
    REQUIRE(u.has_value());
    std::vector<std::byte> x(t.nbytes), y(u->nbytes);
    sa.read(t, x);
    sd.read(*u, y);
    CHECK_MESSAGE(x == y, std::string(name));
  });
}

TEST_CASE("bad dimensions are refused with exit 2, naming the flag, creating nothing") {
  TempDir dir;
  const fs::path out = dir.path / "never";
  const std::pair<const char*, const char*> cases[] = {
      {"--experts 8 --top-k 9", "--top-k"},
      {"--top-k 65 --experts 100", "--top-k"},
      {"--latent 48", "--latent"},
      {"--moe-inter 100", "--moe-inter"},
      {"--heads 40 --head-dim 32", "--heads"},
      {"--full-attn 0,4", "--full-attn"},
      {"--layers 4 --full-attn 2,5", "--full-attn"},
      {"--layers 3 --full-attn 1,2,3", "--full-attn"},
      {"--full-attn 4,x", "--full-attn"},
      {"--layers 0", "--layers"},
      {"--hidden -5", "--hidden"},
      {"--first-dense 9", "--first-dense"},
      {"--size huge", "--size"},
      {"--shards 99", "--shards"},
      {"--layers abc", "--layers"},
      {"--sparse --layers 4", "--layers"},
  };
  for (const auto& [args_, flag] : cases) {
    const auto& args = args_;  // doctest's lambdas need a variable: clang 14 cannot capture a binding
    Run r = k3flow(fmt::format("synth {} {}", out.string(), args));
    CHECK_MESSAGE(r.code == 2, args, " -> ", r.code, " ", r.err);
    CHECK_MESSAGE(r.err.find(flag) != std::string::npos, args, " -> ", r.err);
    CHECK_MESSAGE(std::count(r.err.begin(), r.err.end(), '\n') <= 2, r.err);
    CHECK_FALSE(fs::exists(out));
  }
}

TEST_CASE("an unwritable OUT_DIR is refused with exit 1, naming it") {
  TempDir dir;
  std::ofstream(dir.path / "file") << "x";
  const fs::path under_file = dir.path / "file" / "out";
  Run r = k3flow(fmt::format("synth {} --size tiny", under_file.string()));
  CHECK(r.code == 1);
  CHECK_MESSAGE(r.err.find(under_file.string()) != std::string::npos, r.err);
  Run p = k3flow("synth /proc/k3flow-synth-test --size tiny");
  CHECK(p.code == 1);
  CHECK_MESSAGE(p.err.find("/proc/k3flow-synth-test") != std::string::npos, p.err);
}

TEST_CASE("the free-space refusal tells two close sizes apart, in bytes and binary units") {
  // Both round to "0.02 GB", which is how the refusal read once.
  const std::string m = k3::io::synth::free_space_refusal("/out", 21'474'836, 21'500'000);
  CHECK(m ==
        "output directory /out has 21474836 bytes free (20.48 MiB), the checkpoint needs 21500000 bytes "
        "(20.50 MiB)");
  const std::string n = k3::io::synth::free_space_refusal("/out", 21'499'999, 21'500'000);
  CHECK_MESSAGE(n.find("21499999 bytes free") != std::string::npos, n);
  CHECK_MESSAGE(n.find("needs 21500000 bytes") != std::string::npos, n);
}

TEST_CASE("a failure midway leaves no partial output behind") {
  TempDir dir;
  SUBCASE("directory created by the run is removed again") {
    const fs::path out = dir.path / "a" / "b";
    Run r = k3flow(fmt::format("synth {} --size tiny", out.string()), "K3_SYNTH_FAIL_AFTER=3000000");
    CHECK(r.code == 1);
    CHECK(r.err.find("K3_SYNTH_FAIL_AFTER") != std::string::npos);
    CHECK_FALSE(fs::exists(dir.path / "a"));
  }
  SUBCASE("an existing directory is left as it was") {
    const fs::path out = dir.path / "keep";
    fs::create_directory(out);
    std::ofstream(out / "notes.txt") << "mine";
    Run r =
        k3flow(fmt::format("synth {} --size tiny --shards 2", out.string()), "K3_SYNTH_FAIL_AFTER=5000000");
    CHECK(r.code == 1);
    std::vector<std::string> left;
    for (const auto& e : fs::directory_iterator(out)) left.push_back(e.path().filename().string());
    CHECK(left == std::vector<std::string>{"notes.txt"});
  }
  SUBCASE("a sparse run too") {
    const fs::path out = dir.path / "sparse";
    Run r = k3flow(fmt::format("synth {} --sparse", out.string()), "K3_SYNTH_FAIL_AFTER=100000000000");
    CHECK(r.code == 1);
    CHECK_FALSE(fs::exists(out));
  }
}

TEST_CASE("an existing checkpoint is not overwritten without --force") {
  TempDir dir;
  const fs::path out = dir.path / "ckpt";
  REQUIRE(k3flow(fmt::format("synth {} --size tiny", out.string())).code == 0);
  Run again = k3flow(fmt::format("synth {} --size tiny --seed 3", out.string()));
  CHECK(again.code == 1);
  CHECK(again.err.find("--force") != std::string::npos);
  Run forced = k3flow(fmt::format("synth {} --size tiny --seed 3 --shards 2", out.string()));
  CHECK(forced.code == 1);
  Run ok = k3flow(fmt::format("synth {} --size tiny --seed 3 --shards 2 --force", out.string()));
  CHECK_MESSAGE(ok.code == 0, ok.err);
  size_t shards = 0;
  for (const auto& e : fs::directory_iterator(out)) shards += e.path().extension() == ".safetensors";
  CHECK(shards == 2);  // the old one-per-layer shards are gone
}

TEST_CASE("progress bar: drawn when forced, absent when stderr is not a terminal") {
  TempDir dir;
  Run forced = k3flow(fmt::format("synth {} --size tiny --progress", (dir.path / "a").string()));
  REQUIRE(forced.code == 0);
  CHECK(forced.err.find("synth [") != std::string::npos);
  CHECK(forced.err.find("100%") != std::string::npos);
  Run quiet = k3flow(fmt::format("synth {} --size tiny", (dir.path / "b").string()));
  REQUIRE(quiet.code == 0);
  CHECK(quiet.err.empty());
}

TEST_CASE("presets have the advertised sizes and pass validation") {
  const std::pair<const char*, double> sizes[] = {
      {"tiny", 4e6}, {"small", 0.3e9}, {"medium", 3e9}, {"large", 12e9}};
  for (const auto& [name_, bytes] : sizes) {
    const auto& name = name_;  // doctest's lambdas need a variable: clang 14 cannot capture a binding
    const auto plan = k3::io::synth::layout_dense(k3::io::synth::preset_dims(name), 0);
    CHECK_MESSAGE(double(plan.data_bytes()) > bytes / 2, name);
    CHECK_MESSAGE(double(plan.data_bytes()) < bytes * 2, name);
    const auto& c = plan.config;
    CHECK(c.n_experts >= 8 * c.top_k);  // K3-shaped: a token touches a small fraction of experts
  }
  CHECK(k3::io::synth::default_full_attn(93).size() == 24);
  CHECK(k3::io::synth::default_full_attn(93).back() == 93);
}

TEST_CASE("a forward pass over a synthetic model stays finite and non-degenerate") {
  TempDir dir;
  const fs::path m = dir.path / "m", logits = dir.path / "logits.bin";
  REQUIRE(k3flow(fmt::format("synth {} --size tiny --seed 11", m.string())).code == 0);
  Run g = k3flow(fmt::format("generate {} --ids 1,2,3,4,5 --gen 4 --incremental --dump-logits {} --out {}",
                             m.string(), logits.string(), (dir.path / "run.json").string()));
  REQUIRE_MESSAGE(g.code == 0, g.err);
  const std::string raw = slurp(logits);
  REQUIRE(raw.size() == 1024 * sizeof(float));
  std::vector<float> v(1024);
  std::memcpy(v.data(), raw.data(), raw.size());
  double mean = 0;
  for (float x : v) {
    REQUIRE(std::isfinite(x));
    mean += x / v.size();
  }
  const double sd = rms(v, mean);
  CHECK(sd > 0.2);  // logits that differ: the model is not washed out
  CHECK(sd < 5.0);  // and not blown up
}

namespace {

// Starts `k3flow synth OUT --size medium`, waits until its second shard is being written, sends
// `sig`, and returns the wait status.
int synth_and_signal(const fs::path& out, int sig) {
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    const int null = ::open("/dev/null", O_WRONLY);
    ::dup2(null, 1);
    ::dup2(null, 2);
    ::execl(K3FLOW_BIN, K3FLOW_BIN, "synth", out.c_str(), "--size", "medium", static_cast<char*>(nullptr));
    ::_exit(127);
  }
  const fs::path second = out / "model-00002-of-000009.safetensors.partial";
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  int status = 0;
  while (!fs::exists(second) && std::chrono::steady_clock::now() < deadline) {
    if (::waitpid(pid, &status, WNOHANG) == pid) return status;  // finished first: caller fails
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  ::kill(pid, sig);
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  return status;
}

}  // namespace

TEST_CASE("interrupted runs: Ctrl-C / SIGTERM remove everything (exit 130 / 143), SIGKILL leaves .partial") {
  TempDir dir;
  const fs::path out = dir.path / "m";
  SUBCASE("SIGINT") {
    const int st = synth_and_signal(out, SIGINT);
    CHECK(WIFEXITED(st));
    CHECK(WEXITSTATUS(st) == 130);
    CHECK_FALSE(fs::exists(out));
  }
  SUBCASE("SIGTERM") {
    const int st = synth_and_signal(out, SIGTERM);
    CHECK(WIFEXITED(st));
    CHECK(WEXITSTATUS(st) == 143);
    CHECK_FALSE(fs::exists(out));
  }
  SUBCASE("SIGKILL, then a new run in the same directory") {
    const int st = synth_and_signal(out, SIGKILL);
    CHECK(WIFSIGNALED(st));
    size_t partial = 0;
    for (const auto& e : fs::directory_iterator(out)) {
      CHECK_MESSAGE(e.path().extension() == ".partial", e.path());
      partial += e.path().extension() == ".partial";
    }
    CHECK(partial >= 1);
    Run again = k3flow(fmt::format("synth {} --size tiny", out.string()));
    CHECK_MESSAGE(again.code == 0, again.err);
    for (const auto& e : fs::directory_iterator(out)) CHECK(e.path().extension() != ".partial");
  }
}
