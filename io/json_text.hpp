// JSON text the project writes by hand (headers, reports, history lines): one string escaper.
#pragma once
#include <string>
#include <string_view>

namespace k3::io {

// `s` as a JSON string literal, quotes included: quote and backslash escaped, control characters
// below 0x20 as \n \r \t \b \f or \u00XX; every other byte (UTF-8 included) passes through.
std::string json_quote(std::string_view s);

}  // namespace k3::io
