// The tool half of K3's chat format (docs/chat.md, "Tools"), used by xtml.cpp: the JSON the
// checkpoint's Python encoder writes, attribute escaping, a call's argument blocks, the tool
// declaration and tool-choice bodies, which call each tool result answers, and a generated call
// read back.
#pragma once
#include <simdjson.h>

#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "io/text/xtml.hpp"

namespace k3::io::text {

// JSON as the reference encoder (Python) writes it: tool declarations are
// json.dumps(sorted, separators=(",", ":"), ensure_ascii=False), a non-string argument value is
// json.dumps(value, ensure_ascii=False) with the default ", " / ": ". The ids depend on those
// bytes: strings escaped as Python does with ensure_ascii off (io::json_quote), integers as
// integers, other numbers as Python's float repr (shortest round trip, "1.0" rather than "1").
struct PyJsonStyle {
  bool compact = true;     // "," and ":"; otherwise ", " and ": "
  bool sort_keys = false;  // every object's keys in code point (UTF-8 byte) order
};
std::string py_json(simdjson::dom::element, PyJsonStyle);
// Parses `text` and writes it with py_json; false (out untouched) when it is not JSON.
bool py_json_text(std::string_view text, PyJsonStyle, std::string& out);

// Attribute values escape & then ".
std::string escape_attr(std::string_view);
// ` key="value"` pairs of a tag header, unescaped; nullopt when the header is anything else.
using AttrList = std::vector<std::pair<std::string, std::string>>;
std::optional<AttrList> parse_attrs(std::string_view header);

// A call's arguments as blocks: one per member of its JSON object, in the object's order, typed
// (boolean / null / number / string / object / array); the value is a string's text, or any other
// value's JSON (Python's default separators). Arguments that are not JSON at all are kept whole as
// a json block. Usage error for JSON that is not an object. Blank arguments: no blocks.
struct ArgumentBlock {
  std::string key, type, value;
};
struct RenderedArguments {
  std::optional<std::string> json_block;
  std::vector<ArgumentBlock> blocks;
};
RenderedArguments render_arguments(const ToolCall&);

// The body of the tool-declare system message for a JSON array of tools.
std::string tools_body(std::string_view tools);
// The body of the tool-choice system message; empty for auto (no message).
std::string tool_choice_body(const ToolChoice&);

// The order messages render in and each tool result's tool name. A run of tool messages answers
// the calls of the assistant message before it: when every result names a call by id, the run is
// put in the calls' order and takes their names; otherwise it keeps its order, and each result
// takes its own name or that of the call at its position (usage error when neither exists).
struct ToolSlot {
  size_t message;
  std::string tool;  // tool messages only
};
std::vector<ToolSlot> order_tool_results(std::span<const ChatMessage>);

// A generated call, from its `<|open|>call` to just before its `<|close|>call<|sep|>`: its tool
// name and its arguments as a compact JSON object (a string-typed value, or one whose text is not
// JSON, as a JSON string; a json block verbatim). Otherwise the reason it is malformed.
std::variant<ToolCall, std::string> parse_call(std::string_view text);

}  // namespace k3::io::text
