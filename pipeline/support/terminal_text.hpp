// Generated text shown on a terminal. A model can emit any byte, and a terminal acts on control
// characters (ESC starts escape sequences that move the cursor, retitle the window or change
// colours; CR and BS overwrite what was shown; BEL rings), so text meant to be read is escaped:
// every C0 control but newline and tab, DEL, and the C1 controls (U+0080..U+009F, as UTF-8) become
// visible `\xHH` / `\u00HH`. Text written to a file or a pipe is left as generated: a script gets
// the model's exact bytes.
#pragma once
#include <cstdio>
#include <string>
#include <string_view>

namespace k3::pipeline {

// `s` with its control characters escaped as above. Works on pieces of a stream as long as no
// piece splits a UTF-8 character (the streaming detokenizer never does).
std::string terminal_escaped(std::string_view s);

// Whether text written to `f` is seen on a terminal (isatty of its descriptor). Never under mpirun,
// whose ranks write to the launcher's pseudo-terminal: their text is written raw.
bool is_terminal(std::FILE* f);

}  // namespace k3::pipeline
