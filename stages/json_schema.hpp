// The JSON Schema subset that constrained sampling accepts (docs/sampling.md, "JSON output"),
// compiled into a table of nodes the byte automaton (stages/json_constraint.hpp) walks. A schema
// outside the subset is refused by name rather than silently loosened.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace k3::stages {

// The JSON types a node allows, as bits.
enum JsonType : uint8_t {
  kJsonObject = 1,
  kJsonArray = 2,
  kJsonString = 4,
  kJsonNumber = 8,  // any number, integers included
  kJsonInteger = 16,
  kJsonBoolean = 32,
  kJsonNull = 64,
  kJsonAny = 127,
};

struct JsonSchemaNode {
  uint8_t types = kJsonAny;
  // Objects: with `closed`, exactly the listed properties may appear (each at most once, in any
  // order; the required ones before '}'); otherwise any key with any value.
  bool closed = false;
  std::vector<std::string> keys;   // each property name as its JSON string literal, sorted bytewise
  std::vector<uint32_t> key_node;  // the node of keys[i]'s value
  uint64_t required = 0;           // bit i: keys[i] is required
  uint32_t items = 0;              // arrays: the node of every element (0: any value)
  // Non-empty: the value is exactly one of these JSON texts (minified, sorted bytewise).
  std::vector<std::string> literals;
};

// Node 0 is "any JSON value"; root is the node the whole output must match.
struct JsonSchema {
  std::vector<JsonSchemaNode> nodes;
  uint32_t root = 0;
};

inline constexpr int kMaxSchemaDepth = 24;
inline constexpr size_t kMaxSchemaProperties = 64;
// The automaton indexes literals (enum values, property names) and their bytes with 16 bits.
inline constexpr size_t kMaxEnumValues = 4096;
inline constexpr size_t kMaxLiteralBytes = 4096;

// {"type":"object"} with any members: OpenAI's response_format json_object.
JsonSchema json_object_schema();

// Compiles a schema given as JSON text. Accepted keywords: type (a name or an array of names among
// object, array, string, number, integer, boolean, null), properties, required, enum, items,
// additionalProperties (false only; properties already close the object), and the annotations
// title, description, $schema. Throws io::Error (usage) whose message starts with `what` and names
// the refused keyword and where it is (a JSON pointer), e.g. "--json-schema s.json: /properties/a:
// 'minLength' is not supported".
JsonSchema compile_json_schema(std::string_view schema_json, std::string_view what);

}  // namespace k3::stages
