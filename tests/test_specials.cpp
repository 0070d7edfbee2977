// io/text/specials.* through Tokenizer::load_dir: tokenizer_config.json refusals, special-token
// matching (allowed vs ordinary, leftmost then longest, adjacent), decode, check_fits.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "io/error.hpp"
#include "io/text/specials.hpp"
#include "io/text/tokenizer.hpp"
#include "tests/run_helpers.hpp"
#include "tests/tokenizer_cases.hpp"

namespace fs = std::filesystem;
using k3::io::text::Pattern;
using k3::io::text::Tokenizer;
using k3::test::TempDir;

namespace {

// A tokenizer directory: `ranks` (a fixture file name) linked as tiktoken.model, `config` as
// tokenizer_config.json.
void make_dir(const TempDir& d, const std::string& ranks, const std::string& config) {
  fs::create_symlink(k3::test::tokenizer_fixture(ranks), d.path / "tiktoken.model");
  std::ofstream(d / "tokenizer_config.json") << config;
}

void refuses(const std::string& config, const std::string& reason) {
  TempDir d;
  make_dir(d, "tiny_bytes.tiktoken", config);
  try {
    (void)Tokenizer::load_dir(d.path);
    FAIL("loaded: " << reason);
  } catch (const k3::io::Error& e) {
    const std::string msg = e.what();
    CAPTURE(msg);
    CHECK(e.kind() == k3::io::ErrorKind::runtime);
    CHECK(msg.rfind(d / "tokenizer_config.json: ", 0) == 0);
    CHECK(msg.find(reason) != std::string::npos);
  }
}

std::vector<int32_t> cat(std::initializer_list<std::vector<int32_t>> parts) {
  std::vector<int32_t> out;
  for (const auto& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}

constexpr const char* kConfig = R"({"added_tokens_decoder": {
  "200000": {"content": "<|a|>", "special": true},
  "200001": {"content": "<|a|>b", "special": true},
  "200002": {"content": "[X]", "special": true},
  "200005": {"content": "|>[X]", "special": true}}, "model_max_length": 1000})";

}  // namespace

TEST_CASE("an empty added_tokens_decoder loads: the byte vocabulary of the tiny model") {
  TempDir d;
  make_dir(d, "tiny_bytes.tiktoken", R"({"added_tokens_decoder": {}})");
  const Tokenizer tok = Tokenizer::load_dir(d.path);
  CHECK(tok.n_ids() == 256);
  CHECK(tok.pattern() == Pattern::kimi);
  CHECK(tok.source() == d.path.string());
  const std::string text = "[EOS] <|end_of_msg|> héllo";
  CHECK(tok.encode(text, true) == tok.encode_ordinary(text));
  CHECK(tok.encode(text, true).size() == text.size());  // one id per byte
  tok.check_fits(256);
  CHECK_THROWS_AS(tok.check_fits(255), k3::io::Error);
}

TEST_CASE("specials: allowed vs ordinary, leftmost then longest, adjacent, at both ends") {
  TempDir d;
  make_dir(d, "o200k_base.tiktoken", kConfig);
  const Tokenizer tok = Tokenizer::load_dir(d.path, Pattern::o200k);
  const auto ord = [&](const std::string& s) { return tok.encode_ordinary(s); };
  CHECK(tok.n_ranks() == 199998);
  CHECK(tok.n_ids() == 200006);
  CHECK(tok.is_special(200005));
  CHECK_FALSE(tok.is_special(200003));
  CHECK_FALSE(tok.is_special(5));
  CHECK(tok.special_id("<|a|>b") == 200001);
  CHECK_FALSE(tok.special_id("<|a|").has_value());

  CHECK(tok.encode("x <|a|> y", true) == cat({ord("x "), {200000}, ord(" y")}));
  const auto plain = tok.encode("x <|a|> y", false);
  CHECK(plain == ord("x <|a|> y"));
  CHECK(std::find(plain.begin(), plain.end(), 200000) == plain.end());
  // Longest at a position: "<|a|>b" beats "<|a|>".
  CHECK(tok.encode("<|a|>bc", true) == cat({{200001}, ord("c")}));
  // Leftmost first: "<|a|>" at 0 beats the longer "|>[X]" at 3; then "[X]" is found on its own.
  CHECK(tok.encode("<|a|>[X]", true) == std::vector<int32_t>{200000, 200002});
  CHECK(tok.encode("z|>[X]", true) == cat({ord("z"), {200005}}));
  CHECK(tok.encode("<|a|><|a|>[X][X]", true) == std::vector<int32_t>{200000, 200000, 200002, 200002});
  CHECK(tok.encode("[X]", true) == std::vector<int32_t>{200002});
  CHECK(tok.encode("<|a", true) == ord("<|a"));

  const std::vector<int32_t> ids{200000, 200001, 200002, 200005};
  CHECK(tok.decode(ids) == "<|a|><|a|>b[X]|>[X]");
  CHECK_THROWS_AS((void)tok.decode(std::vector<int32_t>{200003}), k3::io::Error);
}

TEST_CASE("check_fits names the first id that does not fit") {
  TempDir d;
  make_dir(d, "tiny_bytes.tiktoken",
           R"({"added_tokens_decoder": {"300": {"content": "<s>"}, "302": {"content": "</s>"}}})");
  const Tokenizer tok = Tokenizer::load_dir(d.path);
  CHECK(tok.n_ids() == 303);
  tok.check_fits(303);
  CHECK_THROWS_WITH_AS(tok.check_fits(301), doctest::Contains("token id 302 does not fit"), k3::io::Error);
  CHECK_THROWS_WITH_AS(tok.check_fits(256), doctest::Contains("token id 300 does not fit"), k3::io::Error);
  CHECK_THROWS_WITH_AS(tok.check_fits(200), doctest::Contains("token id 200 does not fit"), k3::io::Error);
  CHECK_THROWS_WITH_AS(tok.check_fits(200), doctest::Contains(d.path.string().c_str()), k3::io::Error);
}

TEST_CASE("every malformed tokenizer_config.json is refused, naming the file and the key") {
  refuses(R"({"model_max_length": 5})", "no `added_tokens_decoder`");
  refuses(R"({"added_tokens_decoder": []})", "is not an object");
  refuses(R"({"added_tokens_decoder": {"abc": {"content": "<s>"}}})",
          "key \"abc\" is not a decimal token id");
  refuses(R"({"added_tokens_decoder": {"-3": {"content": "<s>"}}})", "key \"-3\" is not a decimal token id");
  refuses(R"({"added_tokens_decoder": {"4294967296": {"content": "<s>"}}})", "is not a decimal token id");
  refuses(R"({"added_tokens_decoder": {"300": {"special": true}}})", "[\"300\"] has no string \"content\"");
  refuses(R"({"added_tokens_decoder": {"300": {"content": 7}}})", "[\"300\"] has no string \"content\"");
  refuses(R"({"added_tokens_decoder": {"300": {"content": ""}}})", "empty \"content\"");
  refuses(R"({"added_tokens_decoder": {"300": {"content": "<s>"}, "301": {"content": "<s>"}}})",
          "special tokens 300 and 301 have the same content \"<s>\"");
  refuses(R"({"added_tokens_decoder": {"300": {"content": "<s>"}, "300": {"content": "<t>"}}})",
          "special token id 300 repeats");
  refuses(R"({"added_tokens_decoder": {"100": {"content": "<s>"}}})", "collides with an ordinary rank");
  refuses(R"({"added_tokens_decoder": )", "not valid JSON");
}

TEST_CASE(
    "a directory with neither file is a usage error; with one of them, a runtime error naming the other") {
  TempDir d;
  CHECK_THROWS_WITH_AS((void)Tokenizer::load_dir(d.path), doctest::Contains("not a tokenizer directory"),
                       k3::io::Error);
  try {
    (void)Tokenizer::load_dir(d.path);
  } catch (const k3::io::Error& e) {
    CHECK(e.kind() == k3::io::ErrorKind::usage);
  }
  fs::create_symlink(k3::test::tokenizer_fixture("tiny_bytes.tiktoken"), d.path / "tiktoken.model");
  try {
    (void)Tokenizer::load_dir(d.path);
    FAIL("loaded without a config");
  } catch (const k3::io::Error& e) {
    CHECK(e.kind() == k3::io::ErrorKind::runtime);
    CHECK(std::string(e.what()).find("tokenizer_config.json: missing") != std::string::npos);
  }
}
