// io/text/tokenizer.*: parity with tiktoken on every case of fixtures/tokenizer/ (ids and pieces
// under o200k ranks with both patterns, the real-Kimi-vocabulary pieces), round trips, specials,
// invalid UTF-8, and the accessors.
#include <doctest/doctest.h>

#include <fstream>
#include <string>
#include <vector>

#include "io/error.hpp"
#include "io/text/tokenizer.hpp"
#include "tests/run_helpers.hpp"
#include "tests/tokenizer_cases.hpp"

namespace fs = std::filesystem;
using k3::io::text::Pattern;
using k3::io::text::Tokenizer;
using k3::test::load_cases;
using k3::test::TokCase;
using k3::test::tokenizer_fixture;

namespace {

const Tokenizer& o200k(Pattern p) {
  static const Tokenizer with_o200k =
      Tokenizer::load_vocab(tokenizer_fixture("o200k_base.tiktoken"), Pattern::o200k);
  static const Tokenizer with_kimi =
      Tokenizer::load_vocab(tokenizer_fixture("o200k_base.tiktoken"), Pattern::kimi);
  return p == Pattern::kimi ? with_kimi : with_o200k;
}

std::vector<std::string> pieces(const Tokenizer& t, const std::string& text) {
  std::vector<std::string> out;
  for (const std::string_view p : t.pieces(text)) out.emplace_back(p);
  return out;
}

// Checks ids (if the case has them) and pieces (if it has them) of every case; returns how many
// values were compared so a test can insist it compared something.
size_t check_cases(const std::vector<TokCase>& cases, const Tokenizer& tok, bool check_ids) {
  size_t compared = 0;
  for (const TokCase& c : cases) {
    CAPTURE(c.label);
    if (check_ids && c.has_ids) {
      CHECK(tok.encode_ordinary(c.text) == c.ids);
      ++compared;
    }
    if (c.has_pieces) {
      CHECK(pieces(tok, c.text) == c.pieces);
      ++compared;
    }
  }
  return compared;
}

}  // namespace

TEST_CASE(
    "o200k_cases.json: ids and pieces of every line and of the whole file (o200k ranks + o200k pattern)") {
  const auto cases = load_cases("o200k_cases.json");
  REQUIRE(cases.size() == 312);  // 311 lines + whole_file
  CHECK(cases.back().label == "whole_file");
  CHECK(check_cases(cases, o200k(Pattern::o200k), true) == 2 * cases.size());
}

TEST_CASE("kimi_pattern_cases.json: Kimi-pattern pieces, and ids under o200k ranks + the Kimi pattern") {
  const auto cases = load_cases("kimi_pattern_cases.json");
  REQUIRE(cases.size() == 312);
  CHECK(check_cases(cases, o200k(Pattern::kimi), true) == 2 * cases.size());
}

TEST_CASE("kimi_k2_reference.json: the pieces tiktoken made with Moonshot's own files") {
  const auto cases = load_cases("kimi_k2_reference.json", "expected");
  REQUIRE(cases.size() == 74);
  // The ids are of the real Kimi vocabulary, which is not here; the split is the part we can check.
  CHECK(check_cases(cases, o200k(Pattern::kimi), false) == 73);  // the empty input has no pieces
}

TEST_CASE("o200k_reference.json: the 74 ids and decoded texts") {
  const auto cases = load_cases("o200k_reference.json", "expected");
  REQUIRE(cases.size() == 74);
  const Tokenizer& tok = o200k(Pattern::o200k);
  for (const TokCase& c : cases) {
    CAPTURE(c.label);
    REQUIRE(c.has_ids);
    CHECK(tok.encode_ordinary(c.text) == c.ids);
    CHECK(tok.decode(c.ids) == c.decoded);
  }
}

TEST_CASE("edge_cases.json: contractions, marks, Han, whitespace runs, '/' after a line break") {
  const auto kimi = load_cases("edge_cases.json", "kimi_ids", "kimi_pieces");
  const auto o2 = load_cases("edge_cases.json", "o200k_ids", "o200k_pieces");
  REQUIRE(kimi.size() > 50);
  CHECK(check_cases(kimi, o200k(Pattern::kimi), true) == 2 * kimi.size());
  CHECK(check_cases(o2, o200k(Pattern::o200k), true) == 2 * o2.size());
}

TEST_CASE("decode(encode(x)) == x on every corpus line and reference input, both patterns") {
  for (const char* file :
       {"o200k_cases.json", "kimi_pattern_cases.json", "o200k_reference.json", "edge_cases.json"})
    for (const TokCase& c : load_cases(file))
      for (const Pattern p : {Pattern::o200k, Pattern::kimi}) {
        CAPTURE(file);
        CAPTURE(c.label);
        CHECK(o200k(p).decode(o200k(p).encode_ordinary(c.text)) == c.text);
      }
}

TEST_CASE("invalid UTF-8 is a usage error naming the byte offset") {
  const Tokenizer& tok = o200k(Pattern::kimi);
  for (const auto& [text_, offset] :
       std::vector<std::pair<std::string, size_t>>{{"ab\xC3", 2},
                                                   {"ab\x80xy", 2},
                                                   {"\xED\xA0\x80", 0},
                                                   {"hello \xF4\x90\x80\x80", 6},
                                                   {"é\xC0\xAF", 2}}) {
    const auto& text = text_;  // doctest's lambdas need a variable: clang 14 cannot capture a binding
    CAPTURE(text);
    try {
      (void)tok.encode(text, true);
      FAIL("no error");
    } catch (const k3::io::Error& e) {
      CHECK(e.kind() == k3::io::ErrorKind::usage);
      CHECK(std::string(e.what()).find("byte offset " + std::to_string(offset)) != std::string::npos);
    }
    CHECK_THROWS_AS((void)tok.pieces(text), k3::io::Error);
  }
}

TEST_CASE("decode and token_bytes refuse ids outside the vocabulary, naming them") {
  const Tokenizer& tok = o200k(Pattern::o200k);
  CHECK(tok.n_ranks() == 199998);
  CHECK(tok.n_ids() == 199998);
  for (const int32_t bad : {-1, 199998, 1 << 30}) {
    CAPTURE(bad);
    const std::vector<int32_t> ids{1, bad};
    try {
      (void)tok.decode(ids);
      FAIL("no error");
    } catch (const k3::io::Error& e) {
      CHECK(e.kind() == k3::io::ErrorKind::usage);
      CHECK(std::string(e.what()).find("token id " + std::to_string(bad) + " ") != std::string::npos);
    }
    CHECK_THROWS_AS((void)tok.token_bytes(bad), k3::io::Error);
  }
}

TEST_CASE("parse_pattern accepts kimi and o200k and names the flag otherwise") {
  CHECK(k3::io::text::parse_pattern("kimi", "--pattern") == Pattern::kimi);
  CHECK(k3::io::text::parse_pattern("o200k", "--pattern") == Pattern::o200k);
  try {
    (void)k3::io::text::parse_pattern("cl100k", "--pattern");
    FAIL("no error");
  } catch (const k3::io::Error& e) {
    CHECK(e.kind() == k3::io::ErrorKind::usage);
    CHECK(std::string(e.what()).find("--pattern") != std::string::npos);
    CHECK(std::string(e.what()).find("cl100k") != std::string::npos);
  }
}
