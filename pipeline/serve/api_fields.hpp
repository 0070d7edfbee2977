// Reading one request field with simdjson: each helper refuses a wrong type with a 400 ApiError
// naming the field. Shared by the request parsers (api.cpp, api_sampling.cpp).
#pragma once
#include <fmt/format.h>
#include <simdjson.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "pipeline/serve/api.hpp"

namespace k3::pipeline::serve {

inline ApiError bad(const std::string& message) {
  return ApiError(400, "invalid_request_error", message);
}

// The member, or nullopt when it is absent or null.
inline std::optional<simdjson::dom::element> member(simdjson::dom::object o, std::string_view key) {
  simdjson::dom::element e;
  if (o.at_key(key).get(e) != simdjson::SUCCESS || e.is_null()) return std::nullopt;
  return e;
}

inline std::string as_string(simdjson::dom::element e, std::string_view key) {
  std::string_view s;
  if (e.get(s)) throw bad(fmt::format("'{}' must be a string", key));
  return std::string(s);
}

inline bool as_bool(simdjson::dom::element e, std::string_view key) {
  bool b = false;
  if (e.get(b)) throw bad(fmt::format("'{}' must be true or false", key));
  return b;
}

inline double as_number(simdjson::dom::element e, std::string_view key) {
  double d = 0;
  if (!e.is_number() || e.get(d)) throw bad(fmt::format("'{}' must be a number", key));
  return d;
}

inline int64_t as_integer(simdjson::dom::element e, std::string_view key) {
  int64_t i = 0;
  if (e.get(i)) {
    uint64_t u = 0;
    if (e.get(u) == simdjson::SUCCESS) return INT64_MAX;  // above int64: out of any range we accept
    throw bad(fmt::format("'{}' must be an integer", key));
  }
  return i;
}

}  // namespace k3::pipeline::serve
