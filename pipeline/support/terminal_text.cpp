#include "pipeline/support/terminal_text.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include "io/env.hpp"

namespace k3::pipeline {

std::string terminal_escaped(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    const auto b = static_cast<unsigned char>(s[i]);
    if ((b < 0x20 && b != '\n' && b != '\t') || b == 0x7f) {
      out += fmt::format("\\x{:02x}", b);
    } else if (b == 0xc2 && i + 1 < s.size() && static_cast<unsigned char>(s[i + 1]) >= 0x80 &&
               static_cast<unsigned char>(s[i + 1]) <= 0x9f) {
      out += fmt::format("\\u{:04x}", static_cast<unsigned char>(s[i + 1]));
      ++i;
    } else {
      out += char(b);
    }
  }
  return out;
}

bool is_terminal(std::FILE* f) {
  // Under mpirun a rank's stdout is a pseudo-terminal of the launcher's, whatever the user's stdout
  // is (a pipe, a file), so isatty says nothing about where the text lands: written raw, as to a pipe.
  if (io::env::launcher_ranks() > 0) return false;
  return f != nullptr && ::isatty(::fileno(f)) != 0;
}

}  // namespace k3::pipeline
