// io/text/vocab.*: loading tiktoken rank files, and every refusal with its FILE:LINE message
// (malformed files are written into a temp dir from the 256-byte fixture vocabulary).
#include <doctest/doctest.h>

#include <chrono>
#include <fstream>
#include <string>
#include <vector>

#include "io/error.hpp"
#include "io/text/vocab.hpp"
#include "tests/run_helpers.hpp"
#include "tests/tokenizer_cases.hpp"

using k3::io::text::Vocab;
using k3::test::slurp;
using k3::test::TempDir;

namespace {

// The 256 lines of tiny_bytes.tiktoken (rank = byte value), without their newlines.
std::vector<std::string> byte_lines() {
  std::vector<std::string> lines;
  std::string all = slurp(k3::test::tokenizer_fixture("tiny_bytes.tiktoken"));
  for (size_t pos = 0; pos < all.size();) {
    const size_t nl = all.find('\n', pos);
    lines.push_back(all.substr(pos, nl - pos));
    pos = nl == std::string::npos ? all.size() : nl + 1;
  }
  REQUIRE(lines.size() == 256);
  return lines;
}

std::string join(const std::vector<std::string>& lines) {
  std::string s;
  for (const auto& l : lines) s += l + "\n";
  return s;
}

// Loading `content` fails with a runtime error whose message is "<file>:<where>" followed by text
// containing `reason`.
void refuses(const std::string& content, const std::string& where, const std::string& reason) {
  TempDir d;
  const std::string path = d / "bad.tiktoken";
  std::ofstream(path, std::ios::binary) << content;
  try {
    (void)Vocab::load(path);
    FAIL("loaded: " << reason);
  } catch (const k3::io::Error& e) {
    CHECK(e.kind() == k3::io::ErrorKind::runtime);
    const std::string msg = e.what();
    CAPTURE(msg);
    CHECK(msg.rfind(path + where, 0) == 0);
    CHECK(msg.find(reason) != std::string::npos);
    CHECK(msg.find('\n') == std::string::npos);
  }
}

}  // namespace

TEST_CASE("the byte vocabulary and o200k_base load; lookups find every token at its rank") {
  const Vocab bytes = Vocab::load(k3::test::tokenizer_fixture("tiny_bytes.tiktoken"));
  CHECK(bytes.size() == 256);
  for (int b = 0; b < 256; ++b) CHECK(bytes.byte_rank(uint8_t(b)) == b);

  const auto t0 = std::chrono::steady_clock::now();
  const Vocab o200k = Vocab::load(k3::test::tokenizer_fixture("o200k_base.tiktoken"));
  MESSAGE("o200k_base.tiktoken loaded in "
          << std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count()
          << " ms");
  REQUIRE(o200k.size() == 199998);
  for (int32_t r = 0; r < o200k.size(); ++r)
    if (o200k.find(o200k.bytes(r)) != r) REQUIRE(o200k.find(o200k.bytes(r)) == r);
  CHECK(o200k.find("\xFF\xFE\xFD not a token at all") == -1);
}

TEST_CASE("blank lines and CRLF line ends are accepted, as tiktoken's loader does") {
  auto lines = byte_lines();
  std::string crlf;
  for (const auto& l : lines) crlf += l + "\r\n\n";
  TempDir d;
  std::ofstream(d / "crlf.tiktoken", std::ios::binary) << crlf;
  const Vocab v = Vocab::load(d / "crlf.tiktoken");
  CHECK(v.size() == 256);
  CHECK(v.bytes(65) == "A");
}

TEST_CASE("every malformed rank file is refused with FILE:LINE and the reason") {
  const auto good = byte_lines();
  auto with = [&](size_t i, const std::string& line) {
    auto l = good;
    l[i] = line;
    return join(l);
  };
  refuses(with(1, "!!!! 1"), ":2: ", "not valid base64");
  refuses(with(1, "AQ 1"), ":2: ", "not valid base64");
  refuses(with(1, "A=Q= 1"), ":2: ", "not valid base64");
  refuses(with(2, "Ag=="), ":3: ", "found no space");
  refuses(with(2, "Ag== "), ":3: ", "missing rank");
  refuses(with(2, "Ag== two"), ":3: ", "not a decimal number");
  refuses(with(2, "Ag== 2 3"), ":3: ", "not a decimal number");
  refuses(with(2, "Ag== -2"), ":3: ", "negative");
  refuses(with(2, "Ag== 2147483648"), ":3: ", "not below 2^31");
  refuses(with(2, "Ag== 256"), ":3: ", "out of range");
  refuses(with(3, "Aw== 2"), ":4: ", "rank 2 repeats (first on line 3)");
  refuses(with(3, "Ag== 3"), ":4: ", "already has rank 2 (line 3)");
  refuses(with(4, " 4"), ":5: ", "empty token");
  refuses("", "", "empty rank file");
  refuses("\n\n", "", "empty rank file");
  // Byte 0x41 replaced by a two-byte token: dense ranks, but BPE could not start from "A".
  refuses(with(0x41, "QUI= 65"), "", "no token for the single byte 0x41");
}

TEST_CASE("a missing file is an error naming it") {
  TempDir d;
  CHECK_THROWS_WITH_AS((void)Vocab::load(d / "nope.tiktoken"), doctest::Contains("nope.tiktoken"),
                       k3::io::Error);
}
