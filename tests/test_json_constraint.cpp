// The JSON automaton byte by byte, the token mask against feeding every token on its own, the
// schema subset's refusals, and seeded constrained sampling whose output simdjson parses and
// checks against the schema.
#include <doctest/doctest.h>
#include <simdjson.h>

#include <memory>
#include <random>
#include <string>
#include <vector>

#include "io/error.hpp"
#include "stages/json_constraint.hpp"
#include "stages/json_schema.hpp"
#include "stages/sampler.hpp"

using namespace k3::stages;

namespace {

// Every single byte, then multi-byte tokens shaped like a real vocabulary's JSON-ish pieces; one
// special (id kSpecial, text "<|x|>") and one end id.
constexpr int32_t kSpecial = 256 + 24, kEnd = kSpecial + 1;
std::shared_ptr<const TokenTable> test_table() {
  std::vector<std::string> bytes;
  for (int b = 0; b < 256; ++b) bytes.push_back(std::string(1, char(b)));
  for (const char* t :
       {"{\"", "\":", "\",", "\"}", "},",   "true", "false", "null", "name",     "\"name\"", "age",   "12",
        "0.5", "e+",  "\\n", "  ",  "\n  ", "],",   "[{",    "tru",  "\xc3\xa9", "\xc3",     "\":\"", "\"\""})
    bytes.push_back(t);
  bytes.push_back("<|x|>");
  bytes.push_back("<|end|>");
  std::vector<bool> special(bytes.size(), false);
  special[size_t(kSpecial)] = special[size_t(kEnd)] = true;
  return std::make_shared<TokenTable>(bytes, special, std::vector<int32_t>{kEnd});
}

std::shared_ptr<const JsonSchema> schema(const char* text) {
  return std::make_shared<JsonSchema>(compile_json_schema(text, "test"));
}

bool accepts(const char* schema_text, std::string_view json, const std::string& epilogue = {}) {
  JsonConstraint c(schema(schema_text), test_table(), epilogue);
  return c.feed(json) && c.complete();
}

const char* kPerson = R"({"type":"object","properties":{
  "name":{"type":"string"},
  "age":{"type":"integer"},
  "tags":{"type":"array","items":{"enum":["a","b",12]}},
  "ok":{"type":["boolean","null"]},
  "ratio":{"type":"number"}},
  "required":["name","age"],"additionalProperties":false})";

}  // namespace

TEST_CASE("the automaton accepts exactly the JSON texts that match the schema") {
  CHECK(accepts(kPerson, R"({"name":"x","age":3})"));
  CHECK(accepts(
      kPerson,
      "{ \"age\" : -40 ,\n \"name\":\"\\u00e9\\n\xc3\xa9\", \"tags\":[\"a\",12, \"b\"],\"ok\":null}"));
  CHECK(accepts(kPerson, R"({"name":"","age":0,"ok":true,"ratio":-0.5e+10})"));
  CHECK_FALSE(accepts(kPerson, R"({"name":"x"})"));                        // age is required
  CHECK_FALSE(accepts(kPerson, R"({"name":"x","age":1.5})"));              // integer
  CHECK_FALSE(accepts(kPerson, R"({"name":"x","age":1,"zz":1})"));         // closed object
  CHECK_FALSE(accepts(kPerson, R"({"name":"x","age":1,"age":2})"));        // a key twice
  CHECK_FALSE(accepts(kPerson, R"({"name":"x","age":1,"tags":[1]})"));     // not in the enum
  CHECK_FALSE(accepts(kPerson, R"({"name":"x","age":01})"));               // leading zero
  CHECK_FALSE(accepts(kPerson, "{\"name\":\"\x01\",\"age\":1}"));          // control byte in a string
  CHECK_FALSE(accepts(kPerson, "{\"name\":\"\xc0\xaf\",\"age\":1}"));      // overlong UTF-8
  CHECK_FALSE(accepts(kPerson, "{\"name\":\"\xed\xa0\x80\",\"age\":1}"));  // a surrogate
  CHECK_FALSE(accepts(kPerson, R"({"name":"x","age":1,})"));
  CHECK_FALSE(accepts(kPerson, R"({"name":"x","age":1)"));  // not closed: a prefix, not complete

  const char* any = "{}";
  CHECK(accepts(any, R"([1,{"a":[true,false,null]},"s",-0.0])"));
  CHECK(accepts(any, "7"));  // a number at the top ends with the text
  CHECK_FALSE(accepts(any, "[1,]"));
  CHECK_FALSE(accepts(any, "tru"));
  JsonSchema obj = json_object_schema();
  JsonConstraint c(std::make_shared<JsonSchema>(obj), test_table());
  CHECK_FALSE(c.feed("[]"));
  CHECK(c.feed(R"({"k":{"x":[1,2]}})"));
  CHECK(c.complete());

  // Enum literals where one is a prefix of another: the next byte decides.
  CHECK(accepts(R"({"enum":[1,12]})", "1"));
  CHECK(accepts(R"({"enum":[1,12]})", "12"));
  CHECK(accepts(R"({"type":"array","items":{"enum":[1,12]}})", "[12,1]"));
  CHECK_FALSE(accepts(R"({"enum":[1,12]})", "13"));

  // The epilogue follows the value, after optional whitespace.
  CHECK(accepts("{}", "[] <c>", "<c>"));
  CHECK_FALSE(accepts("{}", "[]", "<c>"));
}

TEST_CASE("whitespace runs and numbers are bounded so the output cannot stall") {
  JsonConstraint c(schema("{}"), test_table());
  CHECK(c.feed("[" + std::string(kMaxWhitespaceRun, ' ')));
  CHECK_FALSE(c.feed(" "));
  CHECK(c.feed("1"));
  CHECK(c.feed(std::string(kMaxIntegerDigits - 1, '2')));
  CHECK_FALSE(c.feed("2"));  // more integer digits than an int64 holds
  CHECK(c.feed(".5"));
  CHECK(c.feed(std::string(size_t(kMaxNumberBytes - kMaxIntegerDigits - 2), '5')));
  CHECK_FALSE(c.feed("5"));  // the byte cap
  CHECK(c.feed(",-0.5e+99"));
  CHECK_FALSE(c.feed("9"));  // a third exponent digit
  CHECK(c.feed(",1E-7]"));
  CHECK(c.complete());
}

TEST_CASE("schemas outside the subset are refused naming the keyword and where it is") {
  const auto refused = [](const char* text, const char* what) {
    try {
      compile_json_schema(text, "--json-schema s.json");
      FAIL("accepted ", text);
    } catch (const k3::io::Error& e) {
      CHECK(e.kind() == k3::io::ErrorKind::usage);
      CHECK_MESSAGE(std::string(e.what()).find(what) != std::string::npos, e.what());
      CHECK(std::string(e.what()).rfind("--json-schema s.json: ", 0) == 0);
    }
  };
  refused(R"({"type":"string","minLength":2})", "/: 'minLength' is not supported");
  refused(R"({"properties":{"a":{"pattern":"x"}}})", "/properties/a: 'pattern' is not supported");
  refused(R"({"type":"array","items":{"$ref":"#"}})", "/items: '$ref' is not supported");
  refused(R"({"type":"objekt"})", "'type' objekt is not a JSON type");
  refused(R"({"properties":{"a":{}},"required":["b"]})", "'required' names 'b'");
  refused(R"({"additionalProperties":true})", "'additionalProperties' is supported only as false");
  refused(R"({"type":"string","properties":{}})", "type excludes object");
  refused("[1", "not valid JSON");
  std::string many = R"({"enum":[)";
  for (size_t i = 0; i <= kMaxEnumValues; ++i) many += (i ? "," : "") + std::to_string(i);
  refused((many + "]}").c_str(), "'enum' has more than");
}

TEST_CASE("the mask is exactly the set of tokens whose bytes the automaton accepts") {
  const auto table = test_table();
  const char* schemas[] = {kPerson, "{}", R"({"enum":["true",true,1,12]})"};
  std::mt19937 rng(7);
  for (const char* s : schemas) {
    for (const std::string& epilogue : {std::string(), std::string("<|x|>")}) {
      JsonConstraint c(schema(s), table, epilogue);
      // A random walk through allowed tokens, comparing the mask with one-token feeds at each step.
      for (int step = 0; step < 60; ++step) {
        const std::span<const uint64_t> bits = c.allowed(table->size());
        std::vector<int32_t> allowed;
        for (int32_t id = 0; id < int32_t(table->size()); ++id) {
          const bool in_mask = (bits[size_t(id) / 64] >> (id % 64)) & 1;
          bool expected;
          if (id == kEnd) {
            expected = c.complete();
          } else {
            JsonConstraint probe = c;
            expected = probe.feed(table->bytes(id));
          }
          CHECK_MESSAGE(in_mask == expected, "schema ", s, " step ", step, " id ", id);
          if (in_mask) allowed.push_back(id);
        }
        REQUIRE(!allowed.empty());
        const int32_t id = allowed[rng() % allowed.size()];
        if (id == kEnd) break;
        c.accept(id);
      }
    }
  }
}

TEST_CASE("constrained sampling is seeded and its output parses and matches the schema") {
  const auto table = test_table();
  const auto person = schema(kPerson);
  for (double temperature : {0.0, 1.0}) {
    for (uint64_t seed : {1u, 2u, 3u}) {
      std::vector<int32_t> first;
      for (int run = 0; run < 2; ++run) {
        SamplerOptions o;
        o.temperature = temperature;
        o.seed = seed;
        Sampler sampler(o);
        sampler.set_constraint(std::make_unique<JsonConstraint>(person, table));
        std::mt19937 g{unsigned(seed)};
        std::normal_distribution<float> d(0, 3);
        std::vector<float> logits(table->size());
        std::vector<int32_t> ids;
        std::string text;
        for (int step = 0; step < 3000; ++step) {
          for (float& x : logits) x = d(g);
          // Favour closing quotes now and then so strings end within the budget.
          if (step % 8 == 0) logits['"'] += 6;
          const int32_t id = sampler.next(logits, ids);
          ids.push_back(id);
          if (id == kEnd) break;
          text += table->bytes(id);
        }
        REQUIRE_MESSAGE(ids.back() == kEnd, text);
        if (run == 0) {
          first = ids;
          simdjson::dom::parser parser;
          simdjson::dom::element doc;
          REQUIRE_MESSAGE(parser.parse(text).get(doc) == simdjson::SUCCESS, text);
          simdjson::dom::object obj;
          REQUIRE(doc.get(obj) == simdjson::SUCCESS);
          std::string_view name;
          int64_t age = 0;
          CHECK(obj["name"].get(name) == simdjson::SUCCESS);
          CHECK(obj["age"].get(age) == simdjson::SUCCESS);
          for (auto [k, v] : obj) {
            const std::string key(k);
            CHECK((key == "name" || key == "age" || key == "tags" || key == "ok" || key == "ratio"));
            if (key == "ok") CHECK((v.is_bool() || v.is_null()));
            if (key == "ratio") CHECK(v.is_number());
            if (key == "tags") {
              simdjson::dom::array arr;
              REQUIRE(v.get(arr) == simdjson::SUCCESS);
              for (auto t : arr) {
                const std::string m = simdjson::minify(t);
                CHECK((m == "\"a\"" || m == "\"b\"" || m == "12"));
              }
            }
          }
        } else {
          CHECK(ids == first);
        }
      }
    }
  }
}
