#include "pipeline/support/id_list.hpp"

#include <fmt/format.h>

#include <limits>

#include "io/error.hpp"

namespace k3::pipeline {

namespace {

bool is_separator(char ch) {
  return ch == ',' || ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r';
}

}  // namespace

std::vector<int32_t> parse_id_list(std::string_view text, std::string_view flag, int64_t vocab,
                                   bool allow_empty) {
  std::vector<int32_t> out;
  for (size_t i = 0; i < text.size();) {
    if (is_separator(text[i])) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < text.size() && !is_separator(text[j])) ++j;
    const std::string_view item = text.substr(i, j - i);
    // At most 10 digits, so the value below cannot overflow int64 before the int32 check.
    bool ok = item.size() <= 10;
    int64_t v = 0;
    for (char ch : item) {
      if (ch < '0' || ch > '9') {
        ok = false;
        break;
      }
      v = v * 10 + (ch - '0');
    }
    if (!ok || v > std::numeric_limits<int32_t>::max())
      throw io::usage_error(fmt::format(
          "{}: '{}' is not a token id (expected non-negative integers separated by commas or spaces)", flag,
          item));
    out.push_back(static_cast<int32_t>(v));
    i = j;
  }
  if (out.empty() && !allow_empty) throw io::usage_error(fmt::format("{}: no token ids given", flag));
  if (vocab > 0) check_ids_in_vocab(out, vocab, flag);
  return out;
}

void check_ids_in_vocab(std::span<const int32_t> ids, int64_t vocab, std::string_view flag) {
  for (int32_t id : ids)
    if (id >= vocab)
      throw io::usage_error(
          fmt::format("{}: token id {} is outside the vocabulary (0..{})", flag, id, vocab - 1));
}

}  // namespace k3::pipeline
