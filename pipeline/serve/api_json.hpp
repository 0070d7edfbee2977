// Reading a request body's fields (simdjson DOM) for pipeline/serve/api*.cpp: each helper throws
// the 400 ApiError that names the field.
#pragma once
#include <fmt/format.h>
#include <simdjson.h>

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "io/text/xtml.hpp"
#include "pipeline/serve/api.hpp"

namespace k3::pipeline::serve {

inline ApiError bad(const std::string& message) {
  return ApiError(400, "invalid_request_error", message);
}

// The member `key`, absent when missing or null (a client's null means "not given").
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

// A 400 naming `where.KEY` for the first member of the object `o` that is not in `allowed`: a
// nested object's unknown keys are refused by their path as the top-level fields are by name
// (a member whose value is null counts as absent).
inline void refuse_unknown_keys(simdjson::dom::object o, std::string_view where,
                                std::initializer_list<std::string_view> allowed) {
  for (simdjson::dom::key_value_pair kv : o) {
    if (kv.value.is_null() || std::find(allowed.begin(), allowed.end(), kv.key) != allowed.end()) continue;
    throw bad(fmt::format("'{}.{}' is not supported by this server (docs/serve.md lists the fields)", where,
                          kv.key));
  }
}

// Chat requests: the fields about tools and messages (api_tools.cpp).

// A 400 naming the first top-level field this endpoint neither implements nor ignores by design
// (docs/serve.md lists them). A field whose value is null counts as absent.
void refuse_unknown_fields(simdjson::dom::object body, Endpoint);

// `messages` into the conversation (roles system, developer as system, user, assistant with
// reasoning_content and tool_calls, tool with tool_call_id).
std::vector<io::text::ChatMessage> parse_messages(simdjson::dom::object body);

// `tools`, `tool_choice` and `parallel_tool_calls` into the render options and the request.
void parse_tools(simdjson::dom::object body, io::text::ChatOptions&, GenRequest&);

}  // namespace k3::pipeline::serve
