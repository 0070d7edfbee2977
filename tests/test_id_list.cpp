// pipeline/support/id_list: the one rule set every command's --ids follows (generate, bench, detokenize).
#include <doctest/doctest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "io/error.hpp"
#include "pipeline/support/id_list.hpp"

using k3::pipeline::check_ids_in_vocab;
using k3::pipeline::parse_id_list;

namespace {

// The usage error's message, or "" when the call did not throw one.
std::string refusal(const std::string& text, int64_t vocab = 0, bool allow_empty = false) {
  try {
    parse_id_list(text, "--ids", vocab, allow_empty);
  } catch (const k3::io::Error& e) {
    CHECK(e.kind() == k3::io::ErrorKind::usage);
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("commas and whitespace separate ids, in any mix") {
  const std::vector<int32_t> want{1, 22, 333};
  for (const char* text : {"1,22,333", "1 22 333", "1, 22, 333", " 1,,22\t333\n", "1\r\n22 , 333,"}) {
    CAPTURE(text);
    CHECK(parse_id_list(text, "--ids") == want);
  }
  CHECK(parse_id_list("0", "--ids") == std::vector<int32_t>{0});
  CHECK(parse_id_list("2147483647", "--ids") == std::vector<int32_t>{2147483647});
  CHECK(parse_id_list("007", "--ids") == std::vector<int32_t>{7});
}

TEST_CASE("each item is a non-negative decimal int32; the message names the flag and the item") {
  CHECK(refusal("1,x,3") ==
        "--ids: 'x' is not a token id (expected non-negative integers separated by commas or spaces)");
  for (const char* bad : {"-3", "+3", "1.5", "1e3", "0x10", "2147483648", "99999999999", "12a"}) {
    CAPTURE(bad);
    const std::string m = refusal(std::string("4,") + bad);
    CHECK(m.find(std::string("--ids: '") + bad + "'") == 0);
  }
  // The flag in the message is the caller's.
  try {
    parse_id_list("a", "--prompt-ids");
    FAIL("no refusal");
  } catch (const k3::io::Error& e) {
    CHECK(std::string(e.what()).find("--prompt-ids: 'a'") == 0);
  }
}

TEST_CASE("an empty list is refused unless the caller allows it") {
  for (const char* empty : {"", " ", " , ", ",,\n"}) {
    CAPTURE(empty);
    CHECK(refusal(empty) == "--ids: no token ids given");
    CHECK(parse_id_list(empty, "--ids", 0, true).empty());
  }
}

TEST_CASE("with a known vocabulary every id is below it") {
  CHECK(parse_id_list("0,255", "--ids", 256) == std::vector<int32_t>{0, 255});
  CHECK(refusal("1,256,2", 256) == "--ids: token id 256 is outside the vocabulary (0..255)");
  CHECK(refusal("1,256", 0).empty());  // vocabulary unknown: not checked
  const std::vector<int32_t> ids{3, 300};
  CHECK_NOTHROW(check_ids_in_vocab(ids, 301, "--ids"));
  CHECK_THROWS_WITH_AS(check_ids_in_vocab(ids, 300, "--ids"),
                       "--ids: token id 300 is outside the vocabulary (0..299)", k3::io::Error);
}
