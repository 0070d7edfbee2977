// UTF-8 as the tokenizer needs it: strict decoding (no overlong forms, no surrogates, nothing above
// U+10FFFF) and Python's errors="replace" decoding, which the streaming detokenizer builds on.
#pragma once
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace k3::io::text {

// Decodes the well-formed sequence starting at s[i] into `cp` and returns its length (1..4), or 0
// when the bytes there are not a complete well-formed sequence.
inline size_t utf8_decode(const unsigned char* s, size_t n, size_t i, uint32_t& cp) {
  const unsigned b0 = s[i];
  if (b0 < 0x80) {
    cp = b0;
    return 1;
  }
  auto cont = [&](size_t k, unsigned lo, unsigned hi) {
    return i + k < n && s[i + k] >= lo && s[i + k] <= hi;
  };
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    if (!cont(1, 0x80, 0xBF)) return 0;
    cp = ((b0 & 0x1F) << 6) | (s[i + 1] & 0x3F);
    return 2;
  }
  if (b0 >= 0xE0 && b0 <= 0xEF) {
    // E0 excludes overlong forms, ED excludes the surrogates.
    const unsigned lo = b0 == 0xE0 ? 0xA0 : 0x80, hi = b0 == 0xED ? 0x9F : 0xBF;
    if (!cont(1, lo, hi) || !cont(2, 0x80, 0xBF)) return 0;
    cp = ((b0 & 0x0F) << 12) | ((s[i + 1] & 0x3F) << 6) | (s[i + 2] & 0x3F);
    return 3;
  }
  if (b0 >= 0xF0 && b0 <= 0xF4) {
    // F0 excludes overlong forms, F4 stops at U+10FFFF.
    const unsigned lo = b0 == 0xF0 ? 0x90 : 0x80, hi = b0 == 0xF4 ? 0x8F : 0xBF;
    if (!cont(1, lo, hi) || !cont(2, 0x80, 0xBF) || !cont(3, 0x80, 0xBF)) return 0;
    cp = ((b0 & 0x07) << 18) | ((s[i + 1] & 0x3F) << 12) | ((s[i + 2] & 0x3F) << 6) | (s[i + 3] & 0x3F);
    return 4;
  }
  return 0;
}

// The byte offset of the first byte that does not begin a well-formed sequence, if any.
std::optional<size_t> first_invalid_utf8(std::string_view text);

// Appends `bytes` to `out` decoded as Python's bytes.decode("utf-8", errors="replace") would:
// well-formed sequences as they are, one U+FFFD per maximal ill-formed subpart (Unicode's
// "maximal subpart" practice). With final == false a trailing sequence that is incomplete but could
// still become well-formed is left undecoded; the return value is the number of bytes consumed.
size_t append_replacing(std::string& out, std::string_view bytes, bool final);

// The whole of `bytes` decoded as above.
inline std::string replace_invalid_utf8(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  append_replacing(out, bytes, true);
  return out;
}

}  // namespace k3::io::text
