// The chat history file: JSON Lines, one message per line,
//   {"role": "user", "content": "..."}
//   {"role": "assistant", "content": "...", "reasoning_content": "..."}
// reasoning_content only on assistant lines (and only when the message has it). The file must
// hold a valid conversation (xtml.hpp: check_conversation without a generation prompt).
#pragma once
#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include "io/text/xtml.hpp"

namespace k3::io::text {

// A missing file is an empty history. Anything else wrong is io::Error (runtime) as
// "FILE:LINE: reason" (a blank line, not a JSON object, an unknown or duplicate key, a non-string
// value, a missing role / content, a bad role, reasoning on a non-assistant line, a message out of
// order) or "cannot read FILE: ..." for an unreadable file.
std::vector<ChatMessage> load_history(const std::filesystem::path&);

// Writes the whole history atomically: a temporary file in the same directory, fsync, rename over
// `path`, fsync of the directory. io::Error (runtime) naming the file, and the message, for a
// conversation out of order, text that is not UTF-8, or a failed write (the temporary is removed).
void save_history(const std::filesystem::path&, std::span<const ChatMessage>);

// The exact bytes save_history writes (no validation). Strings are JSON-escaped: quote, backslash
// and every control character below 0x20 (\n \r \t \b \f by name, the rest as \u00XX); all other
// bytes, UTF-8 included, pass through.
std::string history_jsonl(std::span<const ChatMessage>);

}  // namespace k3::io::text
