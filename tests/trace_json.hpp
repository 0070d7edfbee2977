// Reading fields of a Chrome trace event (or any JSON object) in tests: a required integer, and an
// optional integer argument under "args".
#pragma once
#include <doctest/doctest.h>
#include <simdjson.h>

#include <cstdint>

// e[key] as an integer; a missing or non-integer field fails the check and gives -1.
inline int64_t json_int(simdjson::dom::element e, const char* key) {
  int64_t v = -1;
  CHECK_MESSAGE(e[key].get_int64().get(v) == simdjson::SUCCESS, key);
  return v;
}

// e.args.<key> as an integer, -1 when absent.
inline int64_t json_arg(simdjson::dom::element e, const char* key) {
  int64_t v = -1;
  if (e["args"][key].get_int64().get(v) != simdjson::SUCCESS) v = -1;
  return v;
}
