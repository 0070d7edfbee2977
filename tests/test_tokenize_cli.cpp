// `k3flow tokenize` / `k3flow detokenize` through the real binary (K3FLOW_BIN): the fixture corpus
// line by line (ids, pieces, JSON), specials allowed by default and --ordinary, raw-byte decode,
// the tiny model's byte vocabulary, and every refusal with its exit code.
#include <doctest/doctest.h>
#include <simdjson.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "tests/run_helpers.hpp"
#include "tests/tokenizer_cases.hpp"

namespace fs = std::filesystem;
using k3::test::Run;
using k3::test::slurp;
using k3::test::TempDir;
using k3::test::tokenizer_fixture;

namespace {

const std::string kO200k = tokenizer_fixture("o200k_base.tiktoken");

// `k3flow ARGS` (shell words), stdout and stderr apart.
Run k3flow(const std::string& args) {
  return k3::test::k3flow_sh(args);
}

std::vector<std::string> lines(const std::string& s) {
  std::vector<std::string> out;
  for (size_t pos = 0; pos < s.size();) {
    size_t nl = s.find('\n', pos);
    if (nl == std::string::npos) nl = s.size();
    out.push_back(s.substr(pos, nl - pos));
    pos = nl + 1;
  }
  return out;
}

std::string join_ids(const std::vector<int32_t>& ids, const char* sep) {
  std::string s;
  for (size_t i = 0; i < ids.size(); ++i) s += (i ? sep : "") + std::to_string(ids[i]);
  return s;
}

std::vector<std::string> json_strings(const std::string& json) {
  simdjson::dom::parser parser;
  simdjson::dom::array arr;
  REQUIRE(parser.parse(json).get(arr) == simdjson::SUCCESS);
  std::vector<std::string> out;
  for (const auto v : arr) out.emplace_back(v.get_string().value());
  return out;
}

// The corpus (the whole_file text of a case file) written to `path`; its cases, whole_file dropped.
std::vector<k3::test::TokCase> write_corpus(const std::string& file, const std::string& path) {
  auto cases = k3::test::load_cases(file);
  REQUIRE(cases.back().label == "whole_file");
  std::ofstream(path, std::ios::binary) << cases.back().text;
  cases.pop_back();
  return cases;
}

void expect_refusal(const std::string& args, int code, const std::string& message) {
  const Run r = k3flow(args);
  CAPTURE(args);
  CAPTURE(r.err);
  CHECK(r.code == code);
  CHECK(r.out.empty());
  CHECK(r.err.find(message) != std::string::npos);
  // One line, the program's name first.
  CHECK(r.err.rfind("k3flow: ", 0) == 0);
  CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
}

}  // namespace

TEST_CASE("--file: one line of ids per corpus line, equal to the fixture (o200k and Kimi patterns)") {
  TempDir d;
  for (const auto& [file_, pattern] :
       {std::pair{"o200k_cases.json", "o200k"}, {"kimi_pattern_cases.json", "kimi"}}) {
    const auto& file = file_;  // doctest's lambdas need a variable: clang 14 cannot capture a binding
    CAPTURE(file);
    const auto cases = write_corpus(file, d / "corpus.txt");
    const Run r =
        k3flow("tokenize --vocab " + kO200k + " --pattern " + pattern + " --file " + d / "corpus.txt");
    REQUIRE(r.code == 0);
    const auto got = lines(r.out);
    REQUIRE(got.size() == cases.size());
    for (size_t i = 0; i < cases.size(); ++i) {
      CAPTURE(cases[i].label);
      CHECK(got[i] == join_ids(cases[i].ids, " "));
    }
  }
}

TEST_CASE("--pieces and --json print the fixture's pieces and ids per line") {
  TempDir d;
  const auto cases = write_corpus("kimi_pattern_cases.json", d / "corpus.txt");
  const Run pieces = k3flow("tokenize --vocab " + kO200k + " --file " + d / "corpus.txt" + " --pieces");
  REQUIRE(pieces.code == 0);
  const auto piece_lines = lines(pieces.out);
  REQUIRE(piece_lines.size() == cases.size());
  for (size_t i = 0; i < cases.size(); ++i) {
    CAPTURE(cases[i].label);
    CHECK(json_strings(piece_lines[i]) == cases[i].pieces);
  }
  const Run json = k3flow("tokenize --vocab " + kO200k + " --file " + d / "corpus.txt" + " --json");
  REQUIRE(json.code == 0);
  const auto json_lines = lines(json.out);
  REQUIRE(json_lines.size() == cases.size());
  for (size_t i = 0; i < cases.size(); ++i) {
    CAPTURE(cases[i].label);
    CHECK(json_lines[i] == "{\"ids\": [" + join_ids(cases[i].ids, ", ") + "]}");
  }
}

TEST_CASE("TEXT on the command line; detokenize prints the raw bytes back") {
  const auto cases = k3::test::load_cases("o200k_reference.json", "expected");
  // Every fifth case as TEXT (each run loads the 200k vocabulary, so not all 74).
  size_t ran = 0;
  for (size_t i = 0; i < cases.size(); i += 5) {
    const auto& c = cases[i];
    if (c.text.empty() || c.text.find_first_of("'\n\\") != std::string::npos) continue;  // shell quoting
    CAPTURE(c.label);
    const Run r = k3flow("tokenize --vocab " + kO200k + " --pattern o200k '" + c.text + "'");
    REQUIRE(r.code == 0);
    CHECK(r.out == join_ids(c.ids, " ") + "\n");
    ++ran;
  }
  CHECK(ran >= 10);
  // All 74 cases' ids in one detokenize: the decoded texts back to back.
  std::vector<int32_t> all;
  std::string decoded;
  for (const auto& c : cases) {
    all.insert(all.end(), c.ids.begin(), c.ids.end());
    decoded += c.decoded;
  }
  const Run back = k3flow("detokenize --vocab " + kO200k + " --ids " + join_ids(all, ","));
  REQUIRE(back.code == 0);
  CHECK(back.out == decoded);
  // Ids that end inside a code point come out as their raw bytes, not as U+FFFD (the byte
  // vocabulary: rank = byte value, so 226,130 is the first two bytes of U+20AC).
  const Run part =
      k3flow("detokenize --vocab " + tokenizer_fixture("tiny_bytes.tiktoken") + " --ids 65,226,130");
  REQUIRE(part.code == 0);
  CHECK(part.out == "A\xE2\x82");
}

TEST_CASE("MODEL_DIR: specials are ids by default, text with --ordinary; the tiny model's byte vocabulary") {
  TempDir d;
  fs::create_symlink(kO200k, d.path / "tiktoken.model");
  std::ofstream(d / "tokenizer_config.json")
      << R"({"added_tokens_decoder": {"200000": {"content": "[BOS]"}, "200002": {"content": "<|end_of_msg|>"}}})";
  const Run sp = k3flow("tokenize " + d.path.string() + " '[BOS]hi<|end_of_msg|>'");
  REQUIRE(sp.code == 0);
  const Run hi = k3flow("tokenize " + d.path.string() + " hi");
  REQUIRE(hi.code == 0);
  CHECK(sp.out == "200000 " + hi.out.substr(0, hi.out.size() - 1) + " 200002\n");
  const Run ord = k3flow("tokenize --tokenizer " + d.path.string() + " --ordinary '[BOS]hi'");
  REQUIRE(ord.code == 0);
  CHECK(ord.out.find("200000") == std::string::npos);
  const Run plain = k3flow("tokenize --vocab " + kO200k + " '[BOS]hi'");
  CHECK(ord.out == plain.out);
  const Run pieces = k3flow("tokenize " + d.path.string() + " --pieces 'a[BOS]b'");
  CHECK(pieces.out == "[\"a\", \"[BOS]\", \"b\"]\n");
  const Run back = k3flow("detokenize " + d.path.string() + " --ids 200000,200002");
  CHECK(back.out == "[BOS]<|end_of_msg|>");

  const std::string tiny = std::string(K3_FIXTURES) + "/tiny-k3";
  const Run t = k3flow("tokenize " + tiny + " 'hé'");
  REQUIRE(t.code == 0);
  CHECK(t.out == "104 195 169\n");  // one id per UTF-8 byte: rank = byte value in this vocabulary
}

TEST_CASE("refusals: usage errors exit 2 naming the flag, malformed files exit 1 naming FILE:LINE") {
  TempDir d;
  expect_refusal("tokenize hi", 2, "give the text to encode");
  expect_refusal("tokenize --vocab " + kO200k + " --tokenizer " + d.path.string() + " hi", 2,
                 "exactly one tokenizer source");
  expect_refusal("tokenize --vocab " + d / "missing.tiktoken" + " hi", 2,
                 "--vocab " + d / "missing.tiktoken" + ": does not exist");
  expect_refusal("tokenize --vocab " + d.path.string() + " hi", 2, "is a directory, not a file");
  expect_refusal("tokenize --tokenizer " + d / "nowhere" + " hi", 2,
                 "--tokenizer " + d / "nowhere" + ": does not exist");
  expect_refusal("tokenize " + d / "nowhere" + " hi", 2, "MODEL_DIR " + d / "nowhere" + ": does not exist");
  expect_refusal("detokenize " + d / "nowhere" + " --ids 1", 2,
                 "MODEL_DIR " + d / "nowhere" + ": does not exist");
  expect_refusal("tokenize " + d.path.string() + " hi", 2, "has no tiktoken.model");
  expect_refusal("tokenize --vocab " + kO200k + " --pattern cl100k hi", 2, "--pattern");
  expect_refusal("tokenize --vocab " + kO200k, 2, "give the text to encode");
  expect_refusal("tokenize --vocab " + kO200k + " --file " + d / "none.txt", 2, "--file");
  expect_refusal("tokenize --vocab " + kO200k + " a b", 2, "unexpected argument");
  expect_refusal("tokenize --vocab " + kO200k + " $(printf 'ab\\377')", 2, "byte offset 2");
  expect_refusal("detokenize --vocab " + kO200k + " --ids 1,x", 2, "--ids");
  expect_refusal("detokenize --vocab " + kO200k + " --ids 1,-5", 2, "'-5' is not a token id");
  expect_refusal("detokenize --vocab " + kO200k + " --ids 999999", 2, "token id 999999");
  expect_refusal("detokenize --vocab " + kO200k, 2, "--ids");

  std::ofstream(d / "bad.tiktoken") << "QQ== 0\nQg== x\n";
  expect_refusal("tokenize --vocab " + d / "bad.tiktoken" + " hi", 1, d / "bad.tiktoken" + ":2: ");
}
