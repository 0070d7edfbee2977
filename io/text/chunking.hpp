// Moonshot's chunking, which its tokenizer applies before tiktoken sees the text: the input is cut
// into chunks of at most 400,000 code points, and inside each chunk a run of more than 25,000
// consecutive code points that are all whitespace or all non-whitespace (Python's str.isspace) is
// cut every 25,000. Each cut piece is then encoded on its own, specials included.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "io/text/pretokenize.hpp"
#include "io/text/unicode_classes.hpp"

namespace k3::io::text {

constexpr size_t kChunkCodePoints = 400'000;
constexpr size_t kMaxSpaceRun = 25'000;

// The pieces of one chunk of n code points with class bytes cls (kPySpace read): fn(begin, end) in
// code point indices, in order, covering [0, n). Calls fn once with (0, 0) for an empty chunk,
// as Moonshot's generator yields one empty string (which encodes to nothing).
template <class Fn>
void cut_space_runs(const uint8_t* cls, size_t n, size_t max_run, Fn fn) {
  size_t start = 0, run = 0;
  bool run_is_space = n > 0 && (cls[0] & kPySpace);
  for (size_t i = 0; i < n; ++i) {
    const bool is_space = cls[i] & kPySpace;
    if (is_space != run_is_space) {
      run = 1;
      run_is_space = is_space;
    } else if (++run > max_run) {
      fn(start, i);
      start = i;
      run = 1;
    }
  }
  fn(start, n);
}

// The whole of Moonshot's cut of `text`: chunks decoded one at a time (so memory stays bounded by
// the chunk), fn(chunk, first, last) for each cut piece in the chunk's code point indices. Invalid
// UTF-8 is a usage error naming its byte offset.
template <class Fn>
void for_each_cut(std::string_view text, Pattern pattern, Fn fn) {
  DecodedText chunk;
  for (size_t pos = 0; pos < text.size();) {
    pos = decode_code_points(text, pos, kChunkCodePoints, pattern, chunk);
    cut_space_runs(chunk.cls.data(), chunk.size(), kMaxSpaceRun,
                   [&](size_t first, size_t last) { fn(chunk, first, last); });
  }
}

}  // namespace k3::io::text
