// io/text/chunking.hpp: Moonshot's cut points (400,000-code-point chunks, runs of more than 25,000
// space / non-space code points) on the long synthetic texts of python_text.json, whose expected
// cuts Python computed with str.isspace; and that encode applies exactly those cuts.
#include <doctest/doctest.h>
#include <simdjson.h>

#include <string>
#include <vector>

#include "io/text/chunking.hpp"
#include "io/text/tokenizer.hpp"
#include "tests/tokenizer_cases.hpp"

using namespace k3::io::text;

namespace {

struct ChunkCase {
  std::string text;
  std::vector<size_t> cp_bytes;  // byte offset of each code point, plus the end
  std::vector<size_t> cuts;      // the end of every piece, in code points
};

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += char(cp);
  } else if (cp < 0x800) {
    out += char(0xC0 | (cp >> 6)), out += char(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += char(0xE0 | (cp >> 12)), out += char(0x80 | ((cp >> 6) & 0x3F)), out += char(0x80 | (cp & 0x3F));
  } else {
    out += char(0xF0 | (cp >> 18)), out += char(0x80 | ((cp >> 12) & 0x3F));
    out += char(0x80 | ((cp >> 6) & 0x3F)), out += char(0x80 | (cp & 0x3F));
  }
}

std::vector<ChunkCase> chunk_cases() {
  simdjson::dom::parser parser;
  simdjson::dom::element root;
  REQUIRE(parser.load(k3::test::tokenizer_fixture("python_text.json")).get(root) == simdjson::SUCCESS);
  std::vector<ChunkCase> out;
  for (const auto c : root["chunk_cases"].get_array()) {
    ChunkCase cc;
    for (const auto run : c["runs"].get_array()) {
      const std::string_view unit = run.at(0).get_string();
      const uint64_t count = run.at(1).get_uint64();
      // The unit as code points, so offsets can be kept per code point.
      std::vector<uint32_t> cps;
      for (size_t i = 0; i < unit.size();) {
        const auto b = uint8_t(unit[i]);
        const size_t len = b < 0x80 ? 1 : b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4;
        uint32_t cp = len == 1 ? b : b & (0xFF >> (len + 1));
        for (size_t k = 1; k < len; ++k) cp = (cp << 6) | (uint8_t(unit[i + k]) & 0x3F);
        cps.push_back(cp);
        i += len;
      }
      for (uint64_t r = 0; r < count; ++r)
        for (const uint32_t cp : cps) {
          cc.cp_bytes.push_back(cc.text.size());
          append_utf8(cc.text, cp);
        }
    }
    cc.cp_bytes.push_back(cc.text.size());
    REQUIRE(cc.cp_bytes.size() - 1 == c["code_points"].get_uint64());
    for (const auto v : c["cuts"].get_array()) cc.cuts.push_back(size_t(v.get_uint64()));
    out.push_back(std::move(cc));
  }
  REQUIRE(out.size() >= 10);
  return out;
}

}  // namespace

TEST_CASE("cut points equal Python's on every synthetic case") {
  for (const ChunkCase& c : chunk_cases()) {
    CAPTURE(c.text.substr(0, 12));
    CAPTURE(c.cuts.size());
    std::vector<size_t> got;  // piece ends in code points of the whole text
    size_t chunk_base = 0, last_chunk_start = SIZE_MAX;
    for_each_cut(c.text, Pattern::kimi, [&](const DecodedText& t, size_t first, size_t last) {
      const size_t start = size_t(t.bytes.data() - c.text.data());
      if (start != last_chunk_start) {  // a new chunk: the code points before it
        chunk_base =
            size_t(std::lower_bound(c.cp_bytes.begin(), c.cp_bytes.end(), start) - c.cp_bytes.begin());
        last_chunk_start = start;
      }
      CHECK(first <= last);
      got.push_back(chunk_base + last);
    });
    CHECK(got == c.cuts);
  }
}

TEST_CASE("encode is the concatenation of encoding each cut piece alone") {
  const Tokenizer tok =
      Tokenizer::load_vocab(k3::test::tokenizer_fixture("o200k_base.tiktoken"), Pattern::kimi);
  size_t cases_with_cuts = 0;
  for (const ChunkCase& c : chunk_cases()) {
    CAPTURE(c.text.substr(0, 12));
    std::vector<int32_t> want;
    size_t begin = 0;
    for (const size_t end : c.cuts) {
      const std::string piece = c.text.substr(c.cp_bytes[begin], c.cp_bytes[end] - c.cp_bytes[begin]);
      const auto ids = tok.encode_ordinary(piece);
      want.insert(want.end(), ids.begin(), ids.end());
      begin = end;
    }
    cases_with_cuts += c.cuts.size() > 1;
    CHECK(tok.encode_ordinary(c.text) == want);
  }
  CHECK(cases_with_cuts >= 10);
}

TEST_CASE("a chunk cut falls inside a word: the word is split where an uncut encode would not") {
  // The case of 133,330 "ab " then two alphabets: its only cut is the 400,000-code-point chunk end.
  const Tokenizer tok =
      Tokenizer::load_vocab(k3::test::tokenizer_fixture("o200k_base.tiktoken"), Pattern::kimi);
  for (const ChunkCase& c : chunk_cases()) {
    if (c.cuts.size() != 2 || c.cuts[0] != kChunkCodePoints) continue;
    const std::string tail = c.text.substr(c.cp_bytes[c.cuts[0] - 10]);  // no cut inside the tail
    const auto whole = tok.encode_ordinary(c.text);
    const auto tail_ids = tok.encode_ordinary(tail);
    // Had the chunk not been cut, the tail's ids would be a suffix of the whole's; the cut changes them.
    CHECK_FALSE(std::equal(tail_ids.rbegin(), tail_ids.rend(), whole.rbegin()));
    return;
  }
  FAIL("python_text.json has no case cut only at the chunk end");
}
