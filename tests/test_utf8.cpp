// io/text/utf8.* and the StreamDecoder: Python's errors="replace" on the ill-formed byte strings of
// python_text.json (whole and byte by byte), and streaming token by token over the corpora.
#include <doctest/doctest.h>
#include <simdjson.h>

#include <string>
#include <vector>

#include "io/text/tokenizer.hpp"
#include "io/text/utf8.hpp"
#include "tests/tokenizer_cases.hpp"

using namespace k3::io::text;

namespace {

std::string from_hex(std::string_view h) {
  std::string out;
  for (size_t i = 0; i + 1 < h.size(); i += 2)
    out += char(std::stoi(std::string(h.substr(i, 2)), nullptr, 16));
  return out;
}

struct Replace {
  std::string bytes, replaced;
};

std::vector<Replace> replace_cases() {
  simdjson::dom::parser parser;
  simdjson::dom::element root;
  REQUIRE(parser.load(k3::test::tokenizer_fixture("python_text.json")).get(root) == simdjson::SUCCESS);
  std::vector<Replace> out;
  for (const auto c : root["utf8_replace"].get_array())
    out.push_back({from_hex(c["bytes"].get_string().value()), from_hex(c["replaced"].get_string().value())});
  REQUIRE(out.size() > 300);
  return out;
}

const Tokenizer& tiny() {
  static const Tokenizer t = Tokenizer::load_vocab(k3::test::tokenizer_fixture("tiny_bytes.tiktoken"));
  return t;
}

}  // namespace

TEST_CASE("replace_invalid_utf8 equals Python's decode(errors='replace') on every case") {
  for (const Replace& c : replace_cases()) {
    CAPTURE(c.bytes);
    CHECK(replace_invalid_utf8(c.bytes) == c.replaced);
    CHECK(first_invalid_utf8(c.bytes).has_value() == (c.replaced != c.bytes));
  }
}

TEST_CASE("the stream decoder, fed byte by byte (as byte ids or as bytes), equals the whole decode") {
  for (const Replace& c : replace_cases()) {
    CAPTURE(c.bytes);
    StreamDecoder by_id(tiny()), by_bytes(tiny());
    std::string a, b;
    for (const char ch : c.bytes) {
      const std::string out = by_id.push(int32_t(uint8_t(ch)));
      CHECK_FALSE(first_invalid_utf8(out).has_value());  // never half a sequence
      a += out;
      b += by_bytes.push_bytes(std::string(1, ch));
    }
    a += by_id.finish();
    b += by_bytes.finish();
    CHECK(a == c.replaced);
    CHECK(b == c.replaced);
  }
}

TEST_CASE("token by token over the corpora (o200k ids split code points): stream == whole decode") {
  const Tokenizer tok =
      Tokenizer::load_vocab(k3::test::tokenizer_fixture("o200k_base.tiktoken"), Pattern::o200k);
  size_t split_tokens = 0;
  for (const char* file : {"o200k_cases.json", "edge_cases.json"})
    for (const auto& c : k3::test::load_cases(file)) {
      CAPTURE(c.label);
      const auto ids = tok.encode_ordinary(c.text);
      StreamDecoder dec(tok);
      std::string got;
      for (const int32_t id : ids) {
        const std::string out = dec.push(id);
        split_tokens += first_invalid_utf8(tok.token_bytes(id)).has_value();
        CHECK_FALSE(first_invalid_utf8(out).has_value());
        got += out;
      }
      got += dec.finish();
      CHECK(got == c.text);
    }
  CHECK(split_tokens > 0);  // the corpora do hold tokens that are part of a code point
}

TEST_CASE("finish flushes an incomplete sequence as one U+FFFD and the decoder starts afresh") {
  StreamDecoder dec(tiny());
  CHECK(dec.push(0xE2).empty());
  CHECK(dec.push(0x82).empty());
  CHECK(dec.finish() == replace_invalid_utf8("\xE2\x82"));
  CHECK(dec.push('A') == "A");
  CHECK(dec.finish().empty());
}
