#include "io/json_text.hpp"

#include <fmt/format.h>

#include <cmath>
#include <stdexcept>

namespace k3::io {

std::string json_quote(std::string_view s) {
  std::string out;
  out.reserve(s.size() + 2);
  out.push_back('"');
  for (char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20)
          out += fmt::format("\\u{:04x}", static_cast<unsigned>(static_cast<unsigned char>(c)));
        else
          out.push_back(c);
    }
  }
  out.push_back('"');
  return out;
}

namespace {

bool top_lines_at(const JsonWriter::Style& s, size_t depth) {
  return s.top_lines && depth == 1;
}

}  // namespace

void JsonWriter::before_value() {
  if (after_key_) {
    after_key_ = false;
    return;
  }
  if (open_.empty()) {
    if (!out_.empty()) throw std::logic_error("JsonWriter: a second top-level value");
    return;
  }
  Level& l = open_.back();
  if (l.object) throw std::logic_error("JsonWriter: a value in an object needs key() first");
  if (l.any) out_ += style_.spaced ? ", " : ",";
  l.any = true;
}

JsonWriter& JsonWriter::key(std::string_view k) {
  if (open_.empty() || !open_.back().object || after_key_)
    throw std::logic_error("JsonWriter: key() outside an object");
  Level& l = open_.back();
  if (l.any) out_ += style_.spaced && !top_lines_at(style_, open_.size()) ? ", " : ",";
  l.any = true;
  if (top_lines_at(style_, open_.size())) out_ += "\n  ";
  out_ += json_quote(k);
  out_ += style_.spaced ? ": " : ":";
  after_key_ = true;
  return *this;
}

JsonWriter& JsonWriter::begin_object() {
  before_value();
  out_ += '{';
  open_.push_back({true});
  return *this;
}

JsonWriter& JsonWriter::end_object() {
  if (open_.empty() || !open_.back().object || after_key_)
    throw std::logic_error("JsonWriter: end_object() without an open object");
  if (top_lines_at(style_, open_.size())) out_ += '\n';
  open_.pop_back();
  out_ += '}';
  return *this;
}

JsonWriter& JsonWriter::begin_array() {
  before_value();
  out_ += '[';
  open_.push_back({false});
  return *this;
}

JsonWriter& JsonWriter::end_array() {
  if (open_.empty() || open_.back().object)
    throw std::logic_error("JsonWriter: end_array() without an open array");
  open_.pop_back();
  out_ += ']';
  return *this;
}

JsonWriter& JsonWriter::value(std::string_view s) {
  before_value();
  out_ += json_quote(s);
  return *this;
}

JsonWriter& JsonWriter::value(bool b) {
  return raw(b ? "true" : "false");
}

JsonWriter& JsonWriter::value(std::nullptr_t) {
  return raw("null");
}

JsonWriter& JsonWriter::value(double d) {
  // fmt's "{}" is the shortest text that parses back to the same double.
  return std::isfinite(d) ? raw(fmt::format("{}", d)) : raw("null");
}

JsonWriter& JsonWriter::fixed(double d, int decimals) {
  return std::isfinite(d) ? raw(fmt::format("{:.{}f}", d, decimals)) : raw("null");
}

JsonWriter& JsonWriter::raw(std::string_view json) {
  before_value();
  out_ += json;
  return *this;
}

}  // namespace k3::io
