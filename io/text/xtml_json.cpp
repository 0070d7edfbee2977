#include "io/text/xtml_json.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <utility>
#include <vector>

#include "io/json_text.hpp"

namespace k3::io::text {

namespace dom = simdjson::dom;

namespace {

std::string py_float(double d) {
  std::string s = fmt::format("{}", d);
  // fmt's shortest form already switches to exponents where Python's repr does; it writes an
  // integral value without a fraction, which Python's float repr never does.
  if (s.find_first_of(".enI") == std::string::npos) s += ".0";
  return s;
}

void write(dom::element e, const PyJsonStyle& st, std::string& out) {
  const char* comma = st.compact ? "," : ", ";
  const char* colon = st.compact ? ":" : ": ";
  switch (e.type()) {
    case dom::element_type::OBJECT: {
      std::vector<std::pair<std::string_view, dom::element>> members;
      for (dom::key_value_pair kv : dom::object(e)) members.emplace_back(kv.key, kv.value);
      if (st.sort_keys)
        std::stable_sort(members.begin(), members.end(),
                         [](const auto& a, const auto& b) { return a.first < b.first; });
      out += '{';
      for (size_t i = 0; i < members.size(); ++i) {
        if (i) out += comma;
        out += json_quote(members[i].first);
        out += colon;
        write(members[i].second, st, out);
      }
      out += '}';
      return;
    }
    case dom::element_type::ARRAY: {
      out += '[';
      bool first = true;
      for (dom::element v : dom::array(e)) {
        if (!first) out += comma;
        first = false;
        write(v, st, out);
      }
      out += ']';
      return;
    }
    case dom::element_type::STRING:
      out += json_quote(std::string_view(e));
      return;
    case dom::element_type::INT64:
      out += fmt::format("{}", int64_t(e));
      return;
    case dom::element_type::UINT64:
      out += fmt::format("{}", uint64_t(e));
      return;
    case dom::element_type::DOUBLE:
      out += py_float(double(e));
      return;
    case dom::element_type::BOOL:
      out += bool(e) ? "true" : "false";
      return;
    case dom::element_type::NULL_VALUE:
      out += "null";
      return;
  }
}

}  // namespace

std::string py_json(dom::element e, PyJsonStyle st) {
  std::string out;
  write(e, st, out);
  return out;
}

bool py_json_text(std::string_view text, PyJsonStyle st, std::string& out) {
  dom::parser parser;
  dom::element doc;
  if (parser.parse(text.data(), text.size()).get(doc)) return false;
  out = py_json(doc, st);
  return true;
}

}  // namespace k3::io::text
