// Writes the seed corpus of every fuzz target into OUT/<target>/ (.ci/fuzz-smoke runs it into the
// build directory): the repository's fixtures as they are, plus small inputs that only the engine's
// own writers make correctly -- K3ST files from save_state, trunk.json with real XXH64 checksums,
// an index for fixtures/st, texts from the tokenizer fixtures. Usage: make_seeds OUT
#include <fmt/format.h>
#include <simdjson.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "io/config.hpp"
#include "io/packed_trunk.hpp"
#include "io/safetensors.hpp"
#include "pipeline/run/state_file.hpp"
#include "stages/forward.hpp"

namespace fs = std::filesystem;

namespace {

const fs::path kFixtures = K3_FIXTURES;

void put(const fs::path& path, std::string_view bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc).write(bytes.data(), std::streamsize(bytes.size()));
}
void copy_into(const fs::path& from, const fs::path& dir) {
  fs::copy_file(from, dir / from.filename(), fs::copy_options::overwrite_existing);
}
fs::path target_dir(const fs::path& out, const std::string& target) {
  const fs::path d = out / target;
  fs::create_directories(d);
  return d;
}

// A trunk.json in pack-trunk's format for a 64 KiB trunk.bin of zeros (what fuzz_packed_trunk
// opens): `layers` layers of one page each with two tensors, checksums of the zero pages.
std::string trunk_json(int layers, bool checksums, bool source) {
  const std::vector<std::byte> page(k3::io::kTrunkAlign);
  const uint64_t h = k3::io::xxh64(page);
  std::string s = fmt::format(R"({{"format":"k3flow-trunk","version":1,"n_layers":{},"align":4096,)"
                              R"("tensor_align":64,"checksum":"xxh64",)",
                              layers);
  if (source) {
    s += R"("source":{"sample_bytes":4096,"shards":[{"file":"model-00001-of-00001.safetensors",)"
         R"("bytes":1234,"header_xxh64":"0123456789abcdef"}],"layer_samples":[)";
    for (int l = 0; l < layers; ++l) s += fmt::format("{}\"{:016x}\"", l ? "," : "", h ^ uint64_t(l));
    s += "]},";
  }
  s += R"("layers":[)";
  for (int l = 0; l < layers; ++l) {
    s += fmt::format(R"({}{{"layer":{},"file_off":{},"nbytes":4096,)", l ? "," : "", l, l * 4096);
    if (checksums) s += fmt::format(R"("xxh64":"{:016x}",)", h);
    s += fmt::format(R"("tensors":{{"language_model.model.layers.{0}.input_layernorm.weight":)"
                     R"({{"off":0,"nbytes":256,"dtype":"BF16","shape":[128]}},)"
                     R"("language_model.model.layers.{0}.mlp.gate_proj.weight":)"
                     R"({{"off":256,"nbytes":1536,"dtype":"F32","shape":[3,128]}}}}}})",
                     l);
  }
  return s + "]}\n";
}

void state_seed(const fs::path& path, const k3::io::ModelConfig& c, size_t nseq, size_t cached) {
  k3::stages::DecodeState st(c, c.n_layers, 64);
  std::vector<int32_t> seq(nseq);
  for (size_t i = 0; i < nseq; ++i) seq[i] = int32_t((i * 37 + 5) % size_t(c.vocab));
  for (int l = 0; l < c.n_layers; ++l) {
    const auto kda = st.kda_layer(l);
    for (size_t i = 0; i < kda.size(); ++i) kda[i] = float(i % 7) * 0.25f - 0.5f;
  }
  st.cached = cached;
  k3::pipeline::save_state(path, c, seq, st);
}

// Texts from a tokenizer fixture's "cases" (key `key`), each as one seed per flag byte.
void texts(const fs::path& json, const char* key, size_t max, const fs::path& dir, size_t& n) {
  simdjson::dom::parser parser;
  simdjson::dom::element doc = parser.load(json.string());
  size_t taken = 0;
  for (simdjson::dom::element c : doc["cases"].get_array()) {
    std::string_view text;
    if (c[key].get_string().get(text) || text.size() > 4000) continue;
    for (const char flags : {'\0', '\3'})
      put(dir / fmt::format("text{:03}", n++), std::string(1, flags) + std::string(text));
    if (++taken == max) break;
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: make_seeds OUT\n");
    return 2;
  }
  const fs::path out = argv[1];
  try {
    // config.json: the tiny model's (nested), the fixtures' flat wrappers and broken variants.
    {
      const fs::path d = target_dir(out, "config");
      copy_into(kFixtures / "tiny-k3/config.json", d);
      for (const auto& e : fs::directory_iterator(kFixtures / "cfg")) copy_into(e.path(), d);
      // The flat shape, without the wrapper's tensors: the "config" object of fixtures/tiny_k3.json.
      simdjson::dom::parser parser;
      const simdjson::dom::element flat = parser.load((kFixtures / "tiny_k3.json").string())["config"];
      put(d / "flat.json", simdjson::minify(flat));
    }
    // safetensors shards: the two small fixture shards and the cache fixture.
    {
      const fs::path d = target_dir(out, "safetensors");
      for (const auto& e : fs::directory_iterator(kFixtures / "st")) copy_into(e.path(), d);
      for (const auto& e : fs::directory_iterator(kFixtures / "cache")) copy_into(e.path(), d);
    }
    // index: tiny-k3's, and one written for fixtures/st from its headers.
    {
      const fs::path d = target_dir(out, "safetensors_index");
      copy_into(kFixtures / "tiny-k3/model.safetensors.index.json", d);
      const k3::io::ShardSet set = k3::io::ShardSet::open(kFixtures / "st");
      std::string j = R"({"metadata":{"total_size":0},"weight_map":{)";
      bool first = true;
      set.for_each([&](std::string_view name, const k3::io::TensorInfo& t) {
        j += fmt::format(R"({}"{}":"{}")", first ? "" : ",", name,
                         set.shard_path(t.shard).filename().string());
        first = false;
      });
      put(d / "st.index.json", j + "}}\n");
    }
    {
      const fs::path d = target_dir(out, "packed_trunk");
      put(d / "trunk2.json", trunk_json(2, true, true));
      put(d / "trunk3_nosource.json", trunk_json(3, true, false));
      put(d / "trunk1_reference.json", trunk_json(1, false, false));
    }
    {
      // fuzz_codec: a mode byte (1: verify checks, 3: reseal then verify), then a stream of each
      // codec over weight-like bf16 with an odd tail byte, and an incompressible (raw-block) one.
      const fs::path d = target_dir(out, "codec");
      std::vector<std::byte> w(2 * 3000 + 1);
      uint64_t x = 1;
      for (size_t i = 0; i + 1 < w.size(); i += 2) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        const int e = 118 + int((x >> 33) % 6);  // exponents near 2^-9 .. 2^-4, a few escapes
        const uint16_t v = uint16_t(((x >> 60) & 1) << 15 | (x % 97 == 0 ? 1 : e) << 7 | ((x >> 40) & 0x7F));
        std::memcpy(w.data() + i, &v, 2);
      }
      w.back() = std::byte{0x3C};
      std::vector<std::byte> noise(700);
      for (auto& b : noise) b = std::byte((x = x * 6364136223846793005ull + 1) >> 56);
      auto seed = [&](const char* name, uint8_t mode, const std::vector<std::byte>& raw,
                      k3::io::codec::Codec c) {
        const auto enc = k3::io::codec::encode(raw, {.codec = c, .block_values = 1024});
        std::string bytes(1, char(mode));
        bytes.append(reinterpret_cast<const char*>(enc.data()), enc.size());
        put(d / name, bytes);
      };
      seed("exp4.bin", 1, w, k3::io::codec::Codec::exp4);
      seed("huff.bin", 3, w, k3::io::codec::Codec::huff);
      seed("exp3.bin", 1, w, k3::io::codec::Codec::exp3);
      seed("raw_blocks.bin", 1, noise, k3::io::codec::Codec::exp4);
    }
    {
      const fs::path d = target_dir(out, "state_file");
      const k3::io::ModelConfig c = k3::io::load_config(kFixtures / "tiny-k3/config.json");
      state_seed(d / "empty.k3st", c, 0, 0);
      state_seed(d / "five.k3st", c, 5, 5);
      state_seed(d / "eight_cached3.k3st", c, 8, 3);
    }
    {
      const fs::path d = target_dir(out, "vocab");
      copy_into(kFixtures / "tokenizer/tiny_bytes.tiktoken", d);
      // o200k's first 600 ranks: every single byte (ranks 0..255) and the first merges.
      std::ifstream in(kFixtures / "tokenizer/o200k_base.tiktoken");
      std::string line, head;
      for (int i = 0; i < 600 && std::getline(in, line); ++i) head += line + "\n";
      put(d / "o200k_head600.tiktoken", head);
    }
    {
      const fs::path d = target_dir(out, "specials");
      copy_into(kFixtures / "tiny-k3/tokenizer_config.json", d);
      put(d / "kimi_like.json", R"({"added_tokens_decoder": {"256": {"content": "[BOS]", "special": true},
  "257": {"content": "[EOS]"}, "258": {"content": "<|im_end|>"}, "259": {"content": "<|im_"},
  "300": {"content": "<|im_user|>"}, "1000": {"content": "\u00e9t\u00e9"}}, "model_max_length": 8192}
)");
    }
    {
      const fs::path d = target_dir(out, "tokenizer");
      size_t n = 0;
      texts(kFixtures / "tokenizer/edge_cases.json", "text", 60, d, n);
      texts(kFixtures / "tokenizer/o200k_cases.json", "text", 40, d, n);
      texts(kFixtures / "tokenizer/kimi_k2_reference.json", "input", 40, d, n);
      put(d / "specials",
          std::string("\3") + "[BOS]<|im_user|>user<|im_middle|>Hi<|im_end|><|im_<|im_assistant|>");
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "make_seeds: %s\n", e.what());
    return 1;
  }
  return 0;
}
