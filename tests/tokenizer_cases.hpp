// Test helper: the tokenizer case files of fixtures/tokenizer/ (see its README) read with simdjson
// into plain structs. A file or key that is missing throws, so a test cannot pass on no data.
#pragma once
#include <simdjson.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace k3::test {

inline std::string tokenizer_fixture(std::string_view name) {
  return std::string(K3_FIXTURES) + "/tokenizer/" + std::string(name);
}

struct TokCase {
  std::string label;  // "line 12", "whole_file", the input itself for the reference files
  std::string text;
  std::vector<int32_t> ids;
  std::vector<std::string> pieces;
  bool has_ids = false, has_pieces = false;
  std::string decoded;  // the reference files' "decoded"
};

namespace detail {

inline simdjson::dom::element need(simdjson::dom::element e, std::string_view key, const std::string& file) {
  simdjson::dom::element v;
  if (e.at_key(key).get(v) != simdjson::SUCCESS)
    throw std::runtime_error(file + ": no key " + std::string(key));
  return v;
}

inline std::string str(simdjson::dom::element e) {
  std::string_view s;
  if (e.get(s) != simdjson::SUCCESS) throw std::runtime_error("not a string");
  return std::string(s);
}

inline bool read_ids(simdjson::dom::element e, std::string_view key, std::vector<int32_t>& out) {
  simdjson::dom::array a;
  if (e.at_key(key).get(a) != simdjson::SUCCESS) return false;
  for (const auto v : a) out.push_back(int32_t(int64_t(v)));
  return true;
}

inline bool read_strings(simdjson::dom::element e, std::string_view key, std::vector<std::string>& out) {
  simdjson::dom::array a;
  if (e.at_key(key).get(a) != simdjson::SUCCESS) return false;
  for (const auto v : a) out.push_back(str(v));
  return true;
}

}  // namespace detail

// A case file: the corpus files (o200k_cases.json, kimi_pattern_cases.json: "cases" with
// line/text/ids/pieces plus "whole_file"), the reference files (kimi_k2_reference.json,
// o200k_reference.json: "cases" with input/expected/decoded[/pieces]) or edge_cases.json (text and
// <ids_key>/<pieces_key> per pattern).
inline std::vector<TokCase> load_cases(std::string_view name, std::string_view ids_key = "ids",
                                       std::string_view pieces_key = "pieces") {
  const std::string file = tokenizer_fixture(name);
  simdjson::dom::parser parser;
  simdjson::dom::element root;
  if (parser.load(file).get(root) != simdjson::SUCCESS) throw std::runtime_error(file + ": cannot load");
  auto one = [&](simdjson::dom::element c, std::string label) {
    TokCase t;
    simdjson::dom::element e;
    if (c.at_key("input").get(e) == simdjson::SUCCESS) {  // a reference file
      t.text = detail::str(e);
      t.label = "input " + t.text;
      t.has_ids = detail::read_ids(c, "expected", t.ids);
      t.decoded = detail::str(detail::need(c, "decoded", file));
    } else {
      t.text = detail::str(detail::need(c, "text", file));
      t.label = label.empty() ? "text " + t.text : label;
      t.has_ids = detail::read_ids(c, ids_key, t.ids);
    }
    t.has_pieces = detail::read_strings(c, pieces_key, t.pieces);
    return t;
  };
  std::vector<TokCase> out;
  simdjson::dom::array cases;
  if (detail::need(root, "cases", file).get(cases) != simdjson::SUCCESS)
    throw std::runtime_error(file + ": cases");
  for (const auto c : cases) {
    int64_t line = 0;
    out.push_back(
        one(c, c.at_key("line").get(line) == simdjson::SUCCESS ? "line " + std::to_string(line) : ""));
  }
  simdjson::dom::element whole;
  if (root.at_key("whole_file").get(whole) == simdjson::SUCCESS) out.push_back(one(whole, "whole_file"));
  if (out.empty()) throw std::runtime_error(file + ": no cases");
  return out;
}

}  // namespace k3::test
