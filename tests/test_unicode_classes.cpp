// io/text/unicode_classes.*: the class table built from ICU's property ranges agrees, code point
// by code point, with ICU's per-code-point answers, and its str.isspace bit with Python's own list.
#include <doctest/doctest.h>
#include <simdjson.h>
#include <unicode/uchar.h>
#include <unicode/uscript.h>

#include <set>

#include "io/text/unicode_classes.hpp"
#include "tests/tokenizer_cases.hpp"

using namespace k3::io::text;

TEST_CASE("every code point: letters, marks, numbers, Han, White_Space, CR/LF as ICU says") {
  const ClassTable& table = char_classes();
  size_t mismatches = 0;
  for (UChar32 cp = 0; cp < 0x110000; ++cp) {
    const int8_t gc = u_charType(cp);
    const bool lu = gc == U_UPPERCASE_LETTER || gc == U_TITLECASE_LETTER;
    const bool ll = gc == U_LOWERCASE_LETTER;
    const bool lmo = gc == U_MODIFIER_LETTER || gc == U_OTHER_LETTER;
    const bool mark = gc == U_NON_SPACING_MARK || gc == U_ENCLOSING_MARK || gc == U_COMBINING_SPACING_MARK;
    const bool number = gc == U_DECIMAL_DIGIT_NUMBER || gc == U_LETTER_NUMBER || gc == U_OTHER_NUMBER;
    UErrorCode ec = U_ZERO_ERROR;
    const bool han = uscript_getScript(cp, &ec) == USCRIPT_HAN;
    uint8_t want = 0;
    if (lu || lmo || mark) want |= kUpperish;
    if (ll || lmo || mark) want |= kLowerish;
    if (lu || ll || lmo) want |= kLetter;
    if (number) want |= kNumber;
    if (han) want |= kHan;
    if (u_isUWhiteSpace(cp)) want |= kSpace;
    if (cp == '\r' || cp == '\n') want |= kCrLf;
    const uint8_t got = table(uint32_t(cp)) & uint8_t(~kPySpace);
    if (got != want && ++mismatches <= 10) {
      CAPTURE(cp);
      CHECK(int(got) == int(want));
    }
  }
  CHECK(mismatches == 0);
}

TEST_CASE("the str.isspace bit is set exactly on Python's isspace code points (python_text.json)") {
  simdjson::dom::parser parser;
  simdjson::dom::element root;
  REQUIRE(parser.load(k3::test::tokenizer_fixture("python_text.json")).get(root) == simdjson::SUCCESS);
  std::set<uint32_t> python;
  for (const auto v : root["isspace"].get_array()) python.insert(uint32_t(uint64_t(v)));
  REQUIRE(python.size() > 20);
  const ClassTable& table = char_classes();
  for (uint32_t cp = 0; cp < 0x110000; ++cp) {
    if (cp >= 0xD800 && cp <= 0xDFFF) continue;  // not characters Python strings can hold as text
    const bool got = table(cp) & kPySpace;
    if (got != python.count(cp)) {
      CAPTURE(cp);
      CHECK(got == bool(python.count(cp)));
    }
  }
  // The two notions of space differ: U+001C..U+001F are isspace but not White_Space.
  CHECK((table(0x1C) & kPySpace));
  CHECK_FALSE((table(0x1C) & kSpace));
}
