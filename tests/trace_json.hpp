// Reading fields of a Chrome trace event (or any JSON object) in tests: a required integer or string,
// and an optional integer argument under "args".
#pragma once
#include <doctest/doctest.h>
#include <simdjson.h>

#include <cstdint>
#include <string>
#include <string_view>

// e[key] as an integer; a missing or non-integer field fails the check and gives -1.
inline int64_t json_int(simdjson::dom::element e, const char* key) {
  int64_t v = -1;
  CHECK_MESSAGE(e[key].get_int64().get(v) == simdjson::SUCCESS, key);
  return v;
}

// e[key] as a string; a missing or non-string field fails the check and gives "".
inline std::string json_string(simdjson::dom::element e, const char* key) {
  std::string_view v;
  CHECK_MESSAGE(e[key].get_string().get(v) == simdjson::SUCCESS, key);
  return std::string(v);
}

// e.args.<key> as an integer, -1 when absent.
inline int64_t json_arg(simdjson::dom::element e, const char* key) {
  int64_t v = -1;
  if (e["args"][key].get_int64().get(v) != simdjson::SUCCESS) v = -1;
  return v;
}
