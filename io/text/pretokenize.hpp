// The pre-tokenizer: the Kimi or o200k split pattern as a hand-written matcher over code points,
// with the semantics of a backtracking regex engine (leftmost-first alternation, greedy
// quantifiers that give back one code point at a time). docs/tokenizer.md spells out each branch.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "io/text/tokenizer.hpp"
#include "io/text/unicode_classes.hpp"

namespace k3::io::text {

// A stretch of valid UTF-8 decoded once: for code point k, its class byte cls[k] (from
// pattern_classes) and its byte offset off[k] in `bytes`; off has one more entry, the end.
struct DecodedText {
  std::string_view bytes;
  std::vector<uint8_t> cls;
  std::vector<uint32_t> off;

  size_t size() const { return cls.size(); }
};

// The class bytes the matcher reads for `pattern`: Kimi's letter classes exclude Han, so for Kimi a
// Han code point loses kUpperish / kLowerish.
inline uint8_t pattern_class(uint8_t cls, Pattern pattern) {
  if (pattern == Pattern::kimi && (cls & kHan)) cls &= uint8_t(~(kUpperish | kLowerish));
  return cls;
}

// Decodes up to `max_code_points` code points of `text` starting at byte `from` into `out`
// (offsets relative to `from`; out.bytes is the decoded part) and returns the byte offset in `text`
// just past them. Invalid UTF-8 is a usage error (io::Error) naming its byte offset in `text`.
size_t decode_code_points(std::string_view text, size_t from, size_t max_code_points, Pattern pattern,
                          DecodedText& out);

// The end (a code point index) of the pre-token that starts at code point `i`, matching only within
// [i, end): the regex sees the stretch [.., end) as its whole input.
size_t piece_end(const DecodedText& t, size_t i, size_t end, Pattern pattern);

// Calls fn(first, last) for every pre-token of code points [begin, end), in order; the pre-tokens
// cover the stretch exactly.
template <class Fn>
void split_pieces(const DecodedText& t, size_t begin, size_t end, Pattern pattern, Fn fn) {
  for (size_t i = begin; i < end;) {
    const size_t e = piece_end(t, i, end, pattern);
    fn(i, e);
    i = e;
  }
}

}  // namespace k3::io::text
