// JSON as K3's chat format writes it inside a render. The checkpoint's own encoder is Python: tool
// declarations are json.dumps(sorted, separators=(",", ":"), ensure_ascii=False) and a non-string
// tool-call argument is json.dumps(value, ensure_ascii=False) with Python's default ", " / ": "
// separators. The ids depend on those bytes, so this writes them the same way: strings escaped as
// Python does with ensure_ascii off (io::json_quote), integers as integers, other numbers as
// Python's repr of a float (shortest round trip, "1.0" rather than "1", 1e-05 / 1e+16 beyond
// [1e-4, 1e16)).
#pragma once
#include <simdjson.h>

#include <string>
#include <string_view>

namespace k3::io::text {

struct PyJsonStyle {
  bool compact = true;     // "," and ":"; otherwise ", " and ": "
  bool sort_keys = false;  // every object's keys in code point order (UTF-8 byte order)
};

std::string py_json(simdjson::dom::element, PyJsonStyle);

// Parses `text` (a JSON document) and writes it with py_json; nullopt-like failure is reported by
// returning false and leaving `out` untouched.
bool py_json_text(std::string_view text, PyJsonStyle, std::string& out);

}  // namespace k3::io::text
