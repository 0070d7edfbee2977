// `k3flow generate` end to end (the binary, K3FLOW_BIN) on fixtures/tiny-k3: golden logits dump,
// full vs incremental, threads, K3ST save / resume, and every refusal with its exit code.
#include <doctest/doctest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <string>
#include <vector>

#include "io/safetensors.hpp"
#include "tests/fixture_json.hpp"
#include "tests/nan_weight.hpp"
#include "tests/run_helpers.hpp"

namespace fs = std::filesystem;

namespace {

const std::string kModel = std::string(K3_FIXTURES) + "/tiny-k3";
const std::string kPrompt = "203,34,2,239,195,71,163,54,121,104,16,16";
const std::string kFull =
    "203,34,2,239,195,71,163,54,121,104,16,16,219,63,4,31,48,193,57,231,219,205,145,117,79,208,18,1,74,125,"
    "66,121";

using k3::test::Run;
using k3::test::slurp;
using k3::test::TempDir;

// `k3flow ARGS` (shell words); out is stdout and stderr interleaved (2>&1).
Run run(const std::string& args) {
  return k3::test::k3flow_sh(args + " 2>&1");
}

// The "generated_ids":[...] array of a run report, as text.
std::string json_array(const std::string& json, const std::string& key) {
  const size_t at = json.find("\"" + key + "\":[");
  if (at == std::string::npos) return "<missing " + key + ">";
  const size_t open = json.find('[', at), close = json.find(']', open);
  return json.substr(open + 1, close - open - 1);
}

}  // namespace

TEST_CASE("README command: 12-id prompt, 20 tokens incremental, the expected continuation") {
  TempDir d;
  const Run r =
      run("generate " + kModel + " --ids " + kPrompt + " --gen 20 --incremental --out " + d / "run.json");
  INFO(r.out);
  REQUIRE(r.code == 0);
  CHECK(r.out.find("config: ") != std::string::npos);
  CHECK(r.out.find("STEP") != std::string::npos);
  CHECK(r.out.find("PEAK RSS") != std::string::npos);
  CHECK(r.out.find("generated ids: 219 63 4 31 48 193 57 231 219 205 145 117 79 208 18 1 74 125 66 121") !=
        std::string::npos);
  const std::string json = slurp(d / "run.json");
  CHECK(json_array(json, "generated_ids") ==
        "219,63,4,31,48,193,57,231,219,205,145,117,79,208,18,1,74,125,66,121");
  CHECK(json_array(json, "prompt_ids") == kPrompt);
  CHECK(json_array(json, "full_ids") == kFull);
  for (const char* key : {"\"layers\":13", "\"seconds_per_token\":", "\"peak_rss_bytes\":"})
    CHECK(json.find(key) != std::string::npos);
}

TEST_CASE("--dump-logits of the 32 full_ids equals fixtures/golden/tiny_c_logits.bin byte for byte") {
  TempDir d;
  for (const char* mode : {" --recompute", "", " --threads 1 --recompute", " --threads 2"}) {
    CAPTURE(mode);
    const Run r = run("generate " + kModel + " --ids " + kFull + " --gen 1 --dump-logits " + d / "l.bin" +
                      " --out " + d / "r.json" + mode);
    INFO(r.out);
    REQUIRE(r.code == 0);
    const std::string got = slurp(d / "l.bin");
    CHECK(got.size() == 256 * 4);
    CHECK(got == slurp(std::string(K3_FIXTURES) + "/golden/tiny_c_logits.bin"));
    CHECK(json_array(slurp(d / "r.json"), "generated_ids") == "6");
  }
}

TEST_CASE("unseen prompts: full recompute and incremental, 1 and 2 threads give identical ids and logits") {
  TempDir d;
  for (const std::string ids :
       {"5", "17,250,3,3,3,99,0,128", "1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20"}) {
    CAPTURE(ids);
    std::string ref_ids, ref_logits;
    for (const char* mode : {" --recompute", "", " --threads 1 --recompute", " --threads 2 --incremental"}) {
      CAPTURE(mode);
      const Run r = run("generate " + kModel + " --ids \"" + ids + "\" --gen 6 --dump-logits " + d / "l.bin" +
                        " --out " + d / "r.json" + mode);
      REQUIRE(r.code == 0);
      const std::string gen = json_array(slurp(d / "r.json"), "generated_ids"), lg = slurp(d / "l.bin");
      if (ref_ids.empty()) {
        ref_ids = gen;
        ref_logits = lg;
      }
      CHECK(gen == ref_ids);
      CHECK(lg == ref_logits);
    }
  }
}

TEST_CASE("--save-state then --load-state continues exactly like one uninterrupted run") {
  TempDir d;
  const Run whole =
      run("generate " + kModel + " --ids " + kPrompt + " --gen 20 --incremental --out " + d / "a.json");
  REQUIRE(whole.code == 0);
  const std::string want_full = json_array(slurp(d / "a.json"), "full_ids");

  const Run first = run("generate " + kModel + " --ids " + kPrompt + " --gen 8 --incremental --save-state " +
                        d / "s.k3st" + " --out " + d / "b.json");
  INFO(first.out);
  REQUIRE(first.code == 0);
  // 96-byte header + 20 ids + 13 layers of KDA state + 19 cached positions x 4 MLA layers of KV+rope.
  const uint64_t kper = 4 * 16 * 16 + 3 * 64 * 3, kvrow = 4 * (24 + 16) + 8;
  CHECK(fs::file_size(d / "s.k3st") == 96 + 4 * 20 + 4 * kper * 13 + 4 * 19 * kvrow * 4);
  CHECK(slurp(d / "s.k3st").substr(0, 4) == "K3ST");

  // Continue with no new ids: the pending token is fed first.
  const Run second = run("generate " + kModel + " --ids \"\" --gen 12 --incremental --load-state " +
                         d / "s.k3st" + " --out " + d / "c.json");
  INFO(second.out);
  REQUIRE(second.code == 0);
  CHECK(json_array(slurp(d / "c.json"), "full_ids") == want_full);
  CHECK(json_array(slurp(d / "c.json"), "prompt_ids") == "");

  // New ids given on resume are the continuation of the saved sequence.
  const std::string saved_full = json_array(slurp(d / "b.json"), "full_ids");
  const Run direct = run("generate " + kModel + " --ids " + saved_full +
                         ",7,77 --gen 5 --incremental --out " + d / "e.json");
  const Run resumed = run("generate " + kModel + " --ids 7,77 --gen 5 --incremental --load-state " +
                          d / "s.k3st" + " --out " + d / "f.json");
  REQUIRE(direct.code == 0);
  REQUIRE(resumed.code == 0);
  CHECK(json_array(slurp(d / "f.json"), "generated_ids") == json_array(slurp(d / "e.json"), "generated_ids"));
  CHECK(json_array(slurp(d / "f.json"), "full_ids") == json_array(slurp(d / "e.json"), "full_ids"));
}

TEST_CASE(
    "bad state files are refused with exit 1 naming the file; a resumed run recomputes to the same ids") {
  TempDir d;
  REQUIRE(run("generate " + kModel + " --ids 1,2,3 --gen 2 --incremental --save-state " + d / "s.k3st" +
              " --out " + d / "r.json")
              .code == 0);
  const std::string good = slurp(d / "s.k3st");
  auto write = [&](const std::string& name, const std::string& bytes) {
    std::ofstream(d / name, std::ios::binary) << bytes;
    return d / name;
  };
  std::string bad_magic = good, bad_version = good, bad_fp = good;
  bad_magic[0] = 'X';
  bad_version[4] = 2;
  bad_fp[8] = static_cast<char>(bad_fp[8] + 1);  // hidden size
  const struct {
    std::string file, why;
  } cases[] = {
      {write("magic.k3st", bad_magic), "not a k3 state file"},
      {write("version.k3st", bad_version), "version"},
      {write("fp.k3st", bad_fp), "different model architecture"},
      {write("trunc.k3st", good.substr(0, good.size() - 5)), "truncated"},
      {write("header.k3st", good.substr(0, 40)), "not a k3 state file"},
  };
  for (const auto& c : cases) {
    CAPTURE(c.file);
    const Run r = run("generate " + kModel + " --ids 4 --gen 1 --incremental --load-state " + c.file +
                      " --out " + d / "x.json");
    CHECK(r.code == 1);
    CHECK(r.out.find(c.file) != std::string::npos);
    CHECK(r.out.find(c.why) != std::string::npos);
    CHECK(!fs::exists(d / "x.json"));
  }
  // --layers changes the bound-layer count: refused, not silently mixed.
  const Run layers = run("generate " + kModel + " --ids 4 --gen 1 --incremental --layers 5 --load-state " +
                         d / "s.k3st" + " --out " + d / "x.json");
  CHECK(layers.code == 1);
  CHECK(layers.out.find("bound layers") != std::string::npos);

  // Incremental is the default; --recompute re-feeds the restored sequence and must agree.
  const Run inc =
      run("generate " + kModel + " --ids 4 --gen 3 --load-state " + d / "s.k3st" + " --out " + d / "i.json");
  const Run rec = run("generate " + kModel + " --ids 4 --gen 3 --recompute --load-state " + d / "s.k3st" +
                      " --out " + d / "c.json");
  REQUIRE(inc.code == 0);
  REQUIRE(rec.code == 0);
  CHECK(json_array(slurp(d / "i.json"), "generated_ids") == json_array(slurp(d / "c.json"), "generated_ids"));
  CHECK(run("generate " + kModel + " --ids 4 --incremental --recompute").code == 2);
}

TEST_CASE("a state file whose nseq is corrupt is refused naming the file and nseq, not --gen") {
  TempDir d;
  REQUIRE(run("generate " + kModel + " --ids 1,2,3 --gen 2 --incremental --save-state " + d / "s.k3st" +
              " --out " + d / "r.json")
              .code == 0);
  const std::string good = slurp(d / "s.k3st");
  // nseq patched in (header offset 68); `pad` zero bytes appended so the file is long enough for it.
  auto with_nseq = [&](int32_t nseq, size_t pad) {
    std::string bad = good;
    for (int i = 0; i < 4; ++i) bad[68 + i] = static_cast<char>((uint32_t(nseq) >> (8 * i)) & 0xFF);
    bad.append(pad, '\0');
    const std::string file = d / ("nseq_" + std::to_string(nseq) + ".k3st");
    std::ofstream(file, std::ios::binary) << bad;
    return file;
  };
  const struct {
    int32_t nseq;
    size_t pad;
    int code;
    std::string says;
  } cases[] = {
      {2147483647, 0, 1, ": corrupt header: nseq = 2147483647 saved positions need"},
      {40000, 0, 1, ": corrupt header: nseq = 40000 saved positions need"},
      {36864, 4 * 36864, 1, ": nseq = 36864 saved positions, more than the 36863 this build allows"},
      {36000, 4 * 36000, 2, " + prompt + --gen + 1 = 37002 positions exceeds"},
  };
  for (const auto& c : cases) {
    CAPTURE(c.nseq);
    const std::string file = with_nseq(c.nseq, c.pad);
    const Run r = run("generate " + kModel + " --ids 4 --gen 1000 --incremental --load-state " + file +
                      " --out " + d / "x.json");
    CHECK_MESSAGE(r.code == c.code, r.out);
    CHECK_MESSAGE(r.out.find(file + c.says) != std::string::npos, r.out);
    if (c.code == 1) CHECK_MESSAGE(r.out.find("--gen") == std::string::npos, r.out);
    CHECK(!fs::exists(d / "x.json"));
  }
}

TEST_CASE("usage refusals exit 2 naming the flag, and never leave an output file") {
  TempDir d;
  const std::string out = " --out " + d / "r.json" + " --dump-logits " + d / "l.bin";
  const struct {
    std::string args, says;
  } cases[] = {
      {"--ids 1,x,3", "--ids"},
      {"--ids 1,-3", "--ids"},
      {"--ids 1.5", "--ids"},
      {"--ids 256", "outside the vocabulary"},
      {"--ids 99999999999", "--ids"},
      {"--ids \"\"", "--ids: no token ids"},
      {"--ids \" , \"", "--ids: no token ids"},
      {"", "exactly one of --ids, --prompt, --prompt-file"},
      {"--ids 1 --prompt hi", "exactly one of"},
      {"--prompt hi --tokenizer " + d.path.string(), "tiktoken.model"},
      {"--prompt-file " + d.path.string(), "--prompt-file"},
      {"--prompt-file " + d / "absent.txt", "--prompt-file"},
      {"--prompt \"\"", "the prompt is empty"},
      {"--ids 1 --stop x", "--stop"},
      {"--ids 1 --temperature -1", "--temperature"},
      {"--ids 1 --top-p 0", "--top-p"},
      {"--ids 1 --top-k -3", "--top-k"},
      {"--ids 1 --trace " + d / "t.json", "--trace"},
      {"--ids 1 --save-state " + d / "no/such/dir/s.k3st", "no/such/dir"},
      {"--ids 1 --save-state " + d.path.string(), "--save-state"},
      {"--ids 1 --gen 4097", "--gen"},
      {"--ids 1 --gen -1", "--gen"},
      {"--ids 1 --gen abc", "--gen"},
      {"--ids 1 --threads -2", "--threads"},
      {"--ids 1 --frobnicate", "frobnicate"},
      {"--ids 1 --gen 0 --dump-logits " + d / "z.bin", "--dump-logits"},
      {"--ids 1 --config " + d / "missing.json", "--config " + d / "missing.json" + ": does not exist"},
      {"--ids 1 --load-state " + d / "absent.k3st", "--load-state " + d / "absent.k3st" + ": does not exist"},
      {"--ids 1 --layers 14", "--layers 14: the model has 13 layers"},
      {"--ids 1 --layers -1", "--layers"},
  };
  for (const auto& c : cases) {
    CAPTURE(c.args);
    const Run r = run("generate " + kModel + " " + c.args + out);
    INFO(r.out);
    CHECK(r.code == 2);
    CHECK(r.out.find(c.says) != std::string::npos);
    CHECK(!fs::exists(d / "r.json"));
    CHECK(!fs::exists(d / "l.bin"));
  }
  const Run no_dir = run("generate --ids 1");
  CHECK(no_dir.code == 2);
  const Run absent_dir = run("generate " + d / "absent" + " --ids 1");
  CHECK(absent_dir.code == 2);
  CHECK(absent_dir.out == "k3flow: MODEL_DIR " + d / "absent" + ": does not exist\n");

  // A config.json whose content is wrong is a runtime failure (exit 1), one line naming the file,
  // as in every other command.
  const std::string no_layermap = std::string(K3_FIXTURES) + "/cfg/no_layermap.json";
  const Run bad_config = run("generate " + kModel + " --ids 1 --config " + no_layermap + out);
  CHECK(bad_config.code == 1);
  CHECK_MESSAGE(bad_config.out.rfind("k3flow: " + no_layermap, 0) == 0, bad_config.out);
  CHECK_MESSAGE(bad_config.out.find("refusing to substitute defaults") != std::string::npos, bad_config.out);
  CHECK(std::count(bad_config.out.begin(), bad_config.out.end(), '\n') == 1);
  CHECK(!fs::exists(d / "r.json"));

  // --trace into a directory: one line naming the flag and the path, nothing left beside it.
  fs::create_directory(d / "trace.dir");
  const Run trace_dir = run("generate " + kModel + " --ids 1 --gen 1 --mem-gb 1 --trace " + d / "trace.dir");
  CHECK(trace_dir.code == 2);
  CHECK_MESSAGE(trace_dir.out.find("--trace " + d / "trace.dir" + ": is a directory") != std::string::npos,
                trace_dir.out);
  for (const auto& e : fs::directory_iterator(d.path))
    CHECK_MESSAGE(e.path().filename().string().find(".tmp") == std::string::npos, e.path());
}

TEST_CASE("runtime failures exit 1 with one clear line: missing tensors") {
  TempDir d;
  // A checkpoint directory whose config is fine but which has no weights.
  fs::copy_file(kModel + "/config.json", d / "config.json");
  const Run empty = run("generate " + d.path.string() + " --ids 1 --out " + d / "r.json");
  CHECK(empty.code == 1);
  CHECK(!fs::exists(d / "r.json"));

  // --layers N runs a partial stack and says so.
  const Run partial = run("generate " + kModel + " --ids 1,2 --gen 2 --layers 5 --out " + d / "p.json");
  CHECK(partial.code == 0);
  CHECK(partial.out.find("NOTE") != std::string::npos);
  CHECK(slurp(d / "p.json").find("\"layers\":5") != std::string::npos);
}

TEST_CASE("a run whose logits are not finite is invalid: exit 4 naming the position, no report") {
  TempDir d;
  const fs::path m = d.path / "nan-model";
  // NaNs in the final norm's gain poison every logit.
  k3::test::copy_with_nan(kModel, m, "language_model.model.norm.weight");
  const Run r = run("generate " + m.string() + " --ids 1,2,3 --gen 2 --out " + d / "r.json");
  CHECK(r.code == 4);
  CHECK(r.out.find("not finite") != std::string::npos);
  CHECK(r.out.find("position 2") != std::string::npos);
  CHECK(!fs::exists(d / "r.json"));
}
