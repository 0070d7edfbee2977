// io/json_text: the string escaper and the JsonWriter every report is written with. Round trips go
// through simdjson, the parser the tests and `bench` read these reports with.
#include <doctest/doctest.h>
#include <simdjson.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "io/json_text.hpp"

using k3::io::json_quote;
using k3::io::JsonWriter;

TEST_CASE("json_quote escapes quote, backslash and control bytes; UTF-8 passes through") {
  CHECK(json_quote("a\"b\\c") == R"("a\"b\\c")");
  CHECK(json_quote("\n\r\t\b\f") == R"("\n\r\t\b\f")");
  CHECK(json_quote(std::string("\x01\x1f\0", 3)) == R"("\u0001\u001f\u0000")");
  CHECK(json_quote("é 中 \x7f") == "\"é 中 \x7f\"");
}

TEST_CASE("objects and arrays nest with separators; keys and strings are escaped") {
  JsonWriter w;
  const std::vector<int32_t> ids{1, 22, 333};
  w.begin_object()
      .field("ids", ids)
      .field("name", "q\"uote")
      .field("ok", true)
      .field("none", nullptr)
      .key("nested")
      .begin_array()
      .begin_object()
      .end_object()
      .begin_array()
      .end_array()
      .value(int64_t{-5})
      .value(uint64_t{18446744073709551615ull})
      .end_array()
      .field("k\\ey", std::string("v"))
      .end_object();
  CHECK(
      w.str() ==
      R"({"ids":[1,22,333],"name":"q\"uote","ok":true,"none":null,"nested":[{},[],-5,18446744073709551615],"k\\ey":"v"})");
  simdjson::dom::parser p;
  simdjson::dom::element e;
  REQUIRE(p.parse(w.str()).get(e) == simdjson::SUCCESS);
  CHECK(std::string_view(e["name"]) == "q\"uote");
}

TEST_CASE("doubles round-trip exactly; NaN and infinities are null; optional is null when empty") {
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<double> u(-1e6, 1e6);
  std::vector<double> xs{0.0, -0.0, 0.1, 1.0 / 3, 1e-300, 5e-324, 1.7976931348623157e308, 123456789.0};
  for (int i = 0; i < 1000; ++i) xs.push_back(u(rng));
  simdjson::dom::parser p;
  for (double x : xs) {
    JsonWriter w;
    w.begin_array().value(x).end_array();
    simdjson::dom::element e;
    REQUIRE(p.parse(w.str()).get(e) == simdjson::SUCCESS);
    double back = 0;
    // Whole numbers print without a fraction ("1"), which simdjson reads as an integer.
    if (e.at(0).get(back) != simdjson::SUCCESS) back = double(int64_t(e.at(0)));
    CAPTURE(w.str());
    CHECK(back == x);
    CHECK((w.str()[1] == '-') == std::signbit(x));  // -0 keeps its sign in the text ("-0")
  }
  JsonWriter w;
  w.begin_array()
      .value(std::nan(""))
      .value(std::numeric_limits<double>::infinity())
      .value(-std::numeric_limits<double>::infinity())
      .value(std::optional<double>{})
      .value(std::optional<double>{2.5})
      .fixed(1.0 / 3, 4)
      .fixed(std::nan(""), 4)
      .end_array();
  CHECK(w.str() == "[null,null,null,null,2.5,0.3333,null]");
}

TEST_CASE("spaced style and one line per top-level member (inspect --json's layout)") {
  JsonWriter w({.spaced = true, .top_lines = true});
  w.begin_object()
      .field("a", 1)
      .key("b")
      .begin_object()
      .field("x", 1)
      .field("y", 2)
      .end_object()
      .end_object();
  CHECK(w.str() == "{\n  \"a\": 1,\n  \"b\": {\"x\": 1, \"y\": 2}\n}");
  JsonWriter s({.spaced = true});
  s.begin_array().value(1).value("two").end_array();
  CHECK(s.str() == "[1, \"two\"]");
}

TEST_CASE("misuse is a logic error, not malformed JSON") {
  JsonWriter a;
  a.begin_object();
  CHECK_THROWS_AS(a.value(1), std::logic_error);  // a member needs a key
  JsonWriter b;
  CHECK_THROWS_AS(b.key("k"), std::logic_error);
  JsonWriter c;
  c.begin_array();
  CHECK_THROWS_AS(c.end_object(), std::logic_error);
  JsonWriter d;
  d.value(1);
  CHECK_THROWS_AS(d.value(2), std::logic_error);  // one top-level value
}
