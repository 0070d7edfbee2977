// The exit-code table (README "Exit codes", pipeline/support/exit_codes.hpp), one test per row, through the
// real binary (K3FLOW_BIN) on fixtures/tiny-k3: 0 success, 1 a file whose content is wrong, 2 usage
// (a bad flag or value, a path that does not exist or is the wrong kind), 4 a run that completed
// but is invalid, 130 / 143 interrupted. Every refusal is one line on stderr starting "k3flow: ".
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include "io/safetensors.hpp"
#include "tests/nan_weight.hpp"
#include "tests/run_helpers.hpp"

namespace fs = std::filesystem;
using k3::test::Run;
using k3::test::slurp;
using k3::test::TempDir;

namespace {

const std::string kModel = std::string(K3_FIXTURES) + "/tiny-k3";

// `k3flow ARGS` through the shell (quotes, redirections), stdin from /dev/null unless ARGS redirects it.
Run k3flow(const std::string& args) {
  return k3::test::k3flow_sh(args + (args.find('<') == std::string::npos ? " </dev/null" : ""), "", 300);
}

// The refusal contract: the code, and exactly one stderr line that starts with the program's name
// and contains `names` (the file, flag or path it is about). A usage refusal comes before any work,
// so stdout is empty too (a runtime failure may follow generate's config summary there).
void expect_refusal(const std::string& args, int code, const std::string& names) {
  const Run r = k3flow(args);
  CAPTURE(args);
  CAPTURE(r.err);
  CAPTURE(r.out);
  CHECK(r.code == code);
  if (code == 2) CHECK(r.out.empty());
  CHECK(r.err.rfind("k3flow: ", 0) == 0);
  CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
  CHECK(r.err.find(names) != std::string::npos);
}

// A copy of the tiny model whose config.json is `config`.
fs::path model_with_config(const TempDir& d, const std::string& name, const std::string& config) {
  const fs::path m = d.path / name;
  fs::copy(kModel, m);
  std::ofstream(m / "config.json", std::ios::trunc) << config;
  return m;
}

// The tiny model's config.json with `from` replaced by `to` (which must occur).
std::string edited_config(const std::string& from, const std::string& to) {
  std::string c = slurp(kModel + "/config.json");
  const size_t at = c.find(from);
  REQUIRE(at != std::string::npos);
  return c.replace(at, from.size(), to);
}

}  // namespace

TEST_CASE("0: success, and --help of every command") {
  CHECK(k3flow("inspect " + kModel).code == 0);
  CHECK(k3flow("generate " + kModel + " --ids 1,2 --gen 2").code == 0);
  for (const char* cmd :
       {"inspect", "synth", "generate", "chat", "plan", "pack-trunk", "bench", "tokenize", "detokenize"}) {
    CAPTURE(cmd);
    const Run r = k3flow(fmt::format("{} --help", cmd));
    CHECK(r.code == 0);
    CHECK(r.out.find("Usage") != std::string::npos);
    CHECK(r.err.empty());
  }
  CHECK(k3flow("--help").code == 0);
}

TEST_CASE("2: a model directory that does not exist, in every command, one line naming it") {
  TempDir d;
  const std::string none = d / "no-such-model";
  for (const std::string& args : {
           "inspect " + none,
           "inspect " + none + " --json",
           "plan " + none + " --preset laptop",
           "generate " + none + " --ids 1,2",
           "generate " + none + " --prompt hi",
           "chat " + none,
           "pack-trunk " + none + " " + d / "trunk",
           "tokenize " + none + " hi",
           "detokenize " + none + " --ids 1",
           "bench " + none + " --preset laptop",
       }) {
    expect_refusal(args, 2, none);
  }
  CHECK(!fs::exists(d / "trunk"));
  // A file where a directory belongs, and a directory that is not a checkpoint, are the wrong kind.
  std::ofstream(d / "file") << "x";
  expect_refusal("inspect " + d / "file", 2, "MODEL_DIR " + d / "file" + ": is not a directory");
  expect_refusal("generate " + d.path.string() + " --ids 1", 2, "no config.json");
  expect_refusal("synth " + d / "file" + " --size tiny", 2, "OUT_DIR " + d / "file");
}

TEST_CASE("2: a bad flag or value, a missing path flag, a bad command line") {
  TempDir d;
  expect_refusal("generate " + kModel + " --ids 1 --gen 5000", 2, "--gen");
  expect_refusal("generate " + kModel + " --ids 1 --temperature -1", 2, "--temperature");
  expect_refusal("generate " + kModel + " --ids 1,x", 2, "--ids");
  expect_refusal("generate " + kModel + " --ids 1 --layers 99", 2, "--layers 99");
  expect_refusal("generate " + kModel + " --ids 1 --load-state " + d / "none.k3st", 2, "--load-state");
  expect_refusal("generate " + kModel + " --ids 1 --config " + d / "none.json", 2, "--config");
  expect_refusal("generate " + kModel + " --prompt hi --tokenizer " + d / "none", 2, "--tokenizer");
  expect_refusal("generate " + kModel + " --ids 1 --preset laptop --trunk " + d / "none", 2, "--trunk");
  expect_refusal("generate " + kModel + " --ids 1 --out " + d / "no/dir/r.json", 2, "--out");
  expect_refusal("chat " + kModel + " --think-effort medium", 2, "--think-effort");
  expect_refusal("chat " + kModel + " --context 1000000", 2, "--context");
  expect_refusal("plan " + kModel + " --mem-gb -1", 2, "--mem-gb");
  expect_refusal("plan " + kModel + " --preset huge", 2, "--preset");
  expect_refusal("plan " + kModel + " --preset laptop --trunk " + d.path.string(), 2, "no trunk.json");
  expect_refusal("inspect " + kModel + " --bogus", 2, "--bogus");
  expect_refusal("inspect", 2, "MODEL_DIR");
  expect_refusal("", 2, "subcommand");
  expect_refusal("tokenize " + kModel + " --file " + d / "none.txt", 2, "--file");
}

TEST_CASE("1: a config.json whose content is wrong, in every command that reads it, one line naming it") {
  TempDir d;
  const struct {
    std::string name, config, says;
  } cases[] = {
      {"truncated", "{\"text_config\": {\"hidden_size\": ", "not valid JSON"},
      {"eps", edited_config("\"rms_norm_eps\": 1e-05", "\"rms_norm_eps\": 2"), "rms_norm_eps"},
  };
  for (const auto& c : cases) {
    CAPTURE(c.name);
    const fs::path m = model_with_config(d, c.name, c.config);
    const std::string cfg = (m / "config.json").string();
    for (const std::string& args : {
             "inspect " + m.string(),
             "plan " + m.string() + " --preset laptop",
             "generate " + m.string() + " --ids 1,2",
             "generate " + m.string() + " --prompt hi",
             "chat " + m.string(),
         }) {
      expect_refusal(args, 1, cfg);
      const Run r = k3flow(args);
      CHECK(r.err.find(c.says) != std::string::npos);
    }
  }
}

TEST_CASE("1: a checkpoint whose files are wrong (no shards, a truncated shard)") {
  TempDir d;
  const fs::path empty = d.path / "empty";
  fs::create_directories(empty);
  fs::copy_file(kModel + "/config.json", empty / "config.json");
  expect_refusal("inspect " + empty.string(), 1, empty.string());
  expect_refusal("generate " + empty.string() + " --ids 1", 1, empty.string());

  const fs::path cut = d.path / "cut";
  fs::copy(kModel, cut);
  const fs::path shard = cut / "model-00001-of-000001.safetensors";
  fs::resize_file(shard, fs::file_size(shard) / 2);
  expect_refusal("inspect " + cut.string(), 1, shard.string());
  expect_refusal("generate " + cut.string() + " --ids 1", 1, shard.filename().string());
}

TEST_CASE("4: the run completed but its logits are not finite (a NaN weight)") {
  TempDir d;
  const fs::path m = d.path / "nan-model";
  // NaNs in the final norm's gain poison every logit.
  k3::test::copy_with_nan(kModel, m, "language_model.model.norm.weight");
  for (const std::string& flags : {std::string("--ids 1,2,3 --gen 2"), std::string("--prompt hi --gen 2")}) {
    CAPTURE(flags);
    const Run r = k3flow("generate " + m.string() + " " + flags + " --out " + d / "r.json");
    CHECK(r.code == 4);
    CHECK(r.err.find("not finite") != std::string::npos);
    CHECK(!fs::exists(d / "r.json"));
  }
}

TEST_CASE("130 / 143: SIGINT or SIGTERM during a generate stops it between tokens, the report says so") {
  // Streamed so the test hook can slow every token to 300 ms; the signal is sent once step 1 is on
  // stdout, i.e. while the decode loop (and its signal handler) is running.
  for (const auto& [sig_, code] : {std::pair{"INT", 130}, std::pair{"TERM", 143}}) {
    const auto& sig = sig_;  // doctest's lambdas need a variable: clang 14 cannot capture a binding
    CAPTURE(sig);
    TempDir d;
    const Run r = k3::test::shell(
        fmt::format("K3FLOW_TEST_STEP_DELAY_MS=300 {} generate {} --ids 1,2,3 --gen 60 --preset ultra "
                    "--out {} >{} 2>{} & pid=$!; i=0; "
                    "while ! grep -q '^1 ' {} && [ $i -lt 3000 ]; do sleep 0.02; i=$((i+1)); done; "
                    "kill -{} $pid; wait $pid; echo rc=$?",
                    K3FLOW_BIN, kModel, d / "r.json", d / "out.txt", d / "err.txt", d / "out.txt", sig),
        300);
    const std::string err = slurp(d / "err.txt");
    INFO(err);
    REQUIRE(r.code == 0);
    CHECK(r.out.find(fmt::format("rc={}", code)) != std::string::npos);
    // The program, not the signal's default action, ended the run: it says so and wrote its report.
    CHECK(err.find("interrupted after") != std::string::npos);
    CHECK(slurp(d / "r.json").find("\"interrupted\":true") != std::string::npos);
  }
}
