// JSON text the project writes (headers, reports, history lines): one string escaper and one small
// writer, so every report quotes, separates and formats numbers the same way.
#pragma once
#include <concepts>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace k3::io {

// `s` as a JSON string literal, quotes included: quote and backslash escaped, control characters
// below 0x20 as \n \r \t \b \f or \u00XX; every other byte (UTF-8 included) passes through.
std::string json_quote(std::string_view s);

// Builds one JSON value into a string: objects and arrays nest, separators are written for you.
// Doubles are written in the shortest form that reads back to the same double; NaN and ±inf,
// which JSON cannot hold, are written as null. fixed() writes a double with a set number of
// decimals (timings, where the digits past a microsecond are noise).
//
//   JsonWriter w;
//   w.begin_object().field("ids", std::span(ids)).field("seconds", 0.25).end_object();
//   w.str() == R"({"ids":[1,2],"seconds":0.25})"
class JsonWriter {
 public:
  struct Style {
    bool spaced = false;     // ", " and ": " instead of "," and ":"
    bool top_lines = false;  // each member of the outermost object on its own line, indented two spaces
  };
  JsonWriter() = default;
  explicit JsonWriter(Style style) : style_(style) {}

  JsonWriter& begin_object();
  JsonWriter& end_object();
  JsonWriter& begin_array();
  JsonWriter& end_array();
  JsonWriter& key(std::string_view k);  // inside an object, before each member's value

  JsonWriter& value(std::string_view s);
  JsonWriter& value(const char* s) { return value(std::string_view(s)); }
  JsonWriter& value(const std::string& s) { return value(std::string_view(s)); }
  JsonWriter& value(bool b);
  JsonWriter& value(std::nullptr_t);
  JsonWriter& value(double d);
  template <std::integral T>
  requires(!std::same_as<T, bool>) JsonWriter& value(T v) { return raw(std::to_string(v)); }
  template <class T>
  JsonWriter& value(const std::optional<T>& v) {
    return v ? value(*v) : value(nullptr);
  }
  template <class T>
  JsonWriter& value(std::span<const T> items) {
    begin_array();
    for (const T& x : items) value(x);
    return end_array();
  }
  template <class T>
  JsonWriter& value(const std::vector<T>& items) {
    return value(std::span<const T>(items));
  }
  JsonWriter& fixed(double d, int decimals);  // non-finite: null
  // Text that is already one JSON value, written as it is.
  JsonWriter& raw(std::string_view json);

  template <class T>
  JsonWriter& field(std::string_view k, const T& v) {
    key(k);
    return value(v);
  }
  JsonWriter& field(std::string_view k, const char* v) { return key(k).value(v); }
  JsonWriter& fixed_field(std::string_view k, double d, int decimals) { return key(k).fixed(d, decimals); }

  const std::string& str() const { return out_; }

 private:
  void before_value();

  Style style_;
  std::string out_;
  // Per open object / array: has it a member yet? (an object also expects key() before a value).
  struct Level {
    bool object;
    bool any = false;
  };
  std::vector<Level> open_;
  bool after_key_ = false;
};

}  // namespace k3::io
