#include "stages/json_schema.hpp"

#include <fmt/format.h>
#include <simdjson.h>

#include <algorithm>
#include <numeric>

#include "io/error.hpp"
#include "io/json_text.hpp"

namespace k3::stages {

namespace dom = simdjson::dom;

namespace {

uint8_t type_bit(std::string_view name) {
  if (name == "object") return kJsonObject;
  if (name == "array") return kJsonArray;
  if (name == "string") return kJsonString;
  if (name == "number") return kJsonNumber;
  if (name == "integer") return kJsonInteger;
  if (name == "boolean") return kJsonBoolean;
  if (name == "null") return kJsonNull;
  return 0;
}

class Compiler {
 public:
  Compiler(std::string_view what, JsonSchema& out) : what_(what), out_(out) {}

  uint32_t node(dom::element e, const std::string& where, int depth) {
    if (depth > kMaxSchemaDepth) fail(where, fmt::format("nested deeper than {} levels", kMaxSchemaDepth));
    bool b = false;
    if (e.get(b) == simdjson::SUCCESS) {
      if (!b) fail(where, "the schema 'false' matches nothing");
      return 0;  // true: any value
    }
    dom::object o;
    if (e.get(o)) fail(where, "a schema must be an object");
    const uint32_t index = uint32_t(out_.nodes.size());
    out_.nodes.emplace_back();
    JsonSchemaNode n;
    std::optional<dom::object> props;
    std::optional<dom::array> required;
    for (auto [key, value] : o) {
      if (key == "type") {
        n.types = types(value, where);
      } else if (key == "properties") {
        dom::object p;
        if (value.get(p)) fail(where, "'properties' must be an object");
        props = p;
      } else if (key == "required") {
        dom::array r;
        if (value.get(r)) fail(where, "'required' must be an array of names");
        required = r;
      } else if (key == "enum") {
        dom::array a;
        if (value.get(a) || a.size() == 0) fail(where, "'enum' must be a non-empty array");
        for (dom::element v : a) n.literals.push_back(simdjson::minify(v));
        if (n.literals.size() > kMaxEnumValues)
          fail(where, fmt::format("'enum' has more than {} values", kMaxEnumValues));
        for (const std::string& l : n.literals)
          if (l.size() > kMaxLiteralBytes)
            fail(where, fmt::format("an 'enum' value is longer than {} bytes", kMaxLiteralBytes));
        std::sort(n.literals.begin(), n.literals.end());
        n.literals.erase(std::unique(n.literals.begin(), n.literals.end()), n.literals.end());
      } else if (key == "items") {
        n.items = node(value, where + "/items", depth + 1);
      } else if (key == "additionalProperties") {
        bool allowed = true;
        if (value.get(allowed) || allowed)
          fail(where,
               "'additionalProperties' is supported only as false (declared properties close an object)");
      } else if (key == "title" || key == "description" || key == "$schema") {
        // Annotations: they constrain nothing.
      } else {
        fail(where, fmt::format("'{}' is not supported", key));
      }
    }
    if (props) {
      if (props->size() > kMaxSchemaProperties)
        fail(where, fmt::format("more than {} properties", kMaxSchemaProperties));
      std::vector<std::pair<std::string, uint32_t>> keyed;
      for (auto [key, value] : *props) {
        std::string quoted = io::json_quote(key);
        if (quoted.size() > kMaxLiteralBytes)
          fail(where, fmt::format("a property name is longer than {} bytes quoted", kMaxLiteralBytes));
        keyed.emplace_back(std::move(quoted),
                           node(value, where + "/properties/" + std::string(key), depth + 1));
      }
      std::sort(keyed.begin(), keyed.end());
      for (auto& [k, child] : keyed) {
        n.keys.push_back(k);
        n.key_node.push_back(child);
      }
      n.closed = true;
    }
    if (required) {
      for (dom::element r : *required) {
        std::string_view name;
        if (r.get(name)) fail(where, "'required' must be an array of names");
        const auto it = std::find(n.keys.begin(), n.keys.end(), io::json_quote(name));
        if (it == n.keys.end())
          fail(where, fmt::format("'required' names '{}', which is not in 'properties'", name));
        n.required |= uint64_t(1) << (it - n.keys.begin());
      }
    }
    if (props && !(n.types & kJsonObject)) fail(where, "'properties' on a schema whose type excludes object");
    out_.nodes[index] = std::move(n);
    return index;
  }

 private:
  uint8_t types(dom::element v, const std::string& where) {
    std::string_view name;
    if (v.get(name) == simdjson::SUCCESS) {
      const uint8_t bit = type_bit(name);
      if (!bit) fail(where, fmt::format("'type' {} is not a JSON type", name));
      return bit;
    }
    dom::array a;
    if (v.get(a) || a.size() == 0) fail(where, "'type' must be a type name or an array of them");
    uint8_t bits = 0;
    for (dom::element t : a) {
      if (t.get(name)) fail(where, "'type' must be a type name or an array of them");
      const uint8_t bit = type_bit(name);
      if (!bit) fail(where, fmt::format("'type' {} is not a JSON type", name));
      bits |= bit;
    }
    return bits;
  }

  [[noreturn]] void fail(const std::string& where, const std::string& why) {
    throw io::usage_error(fmt::format("{}: {}: {}", what_, where.empty() ? "/" : where, why));
  }

  std::string_view what_;
  JsonSchema& out_;
};

}  // namespace

JsonSchema json_object_schema() {
  JsonSchema s;
  s.nodes.resize(2);
  s.nodes[1].types = kJsonObject;
  s.root = 1;
  return s;
}

JsonSchema compile_json_schema(std::string_view schema_json, std::string_view what) {
  dom::parser parser;
  dom::element doc;
  if (auto err = parser.parse(schema_json.data(), schema_json.size()).get(doc))
    throw io::usage_error(fmt::format("{}: not valid JSON ({})", what, simdjson::error_message(err)));
  JsonSchema s;
  s.nodes.emplace_back();  // node 0: any value
  Compiler c(what, s);
  s.root = c.node(doc, "", 0);
  return s;
}

}  // namespace k3::stages
