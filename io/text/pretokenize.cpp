#include "io/text/pretokenize.hpp"

#include <fmt/format.h>
#include <unicode/uchar.h>

#include "io/error.hpp"
#include "io/text/utf8.hpp"

namespace k3::io::text {

size_t decode_code_points(std::string_view text, size_t from, size_t max_code_points, Pattern pattern,
                          DecodedText& out) {
  const ClassTable& table = char_classes();
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  out.cls.clear();
  out.off.clear();
  const size_t guess = std::min(max_code_points, n - from);
  out.cls.reserve(guess);
  out.off.reserve(guess + 1);
  size_t i = from;
  while (i < n && out.cls.size() < max_code_points) {
    uint32_t cp = s[i];
    size_t len = 1;
    if (cp >= 0x80) {
      len = utf8_decode(s, n, i, cp);
      if (len == 0)
        throw io::usage_error(
            fmt::format("text is not valid UTF-8: byte offset {} (0x{:02X})", i, unsigned(s[i])));
    }
    out.cls.push_back(pattern_class(table(cp), pattern));
    out.off.push_back(uint32_t(i - from));
    i += len;
  }
  out.off.push_back(uint32_t(i - from));
  out.bytes = text.substr(from, i - from);
  return i;
}

namespace {

// The code point at index k (known to be valid UTF-8 of length off[k+1] - off[k]).
uint32_t code_point(const DecodedText& t, size_t k) {
  const auto* s = reinterpret_cast<const unsigned char*>(t.bytes.data());
  uint32_t cp = 0;
  utf8_decode(s, t.bytes.size(), t.off[k], cp);
  return cp;
}

char byte_at(const DecodedText& t, size_t k) {
  return t.bytes[t.off[k]];
}

// (?i:'s|'t|'re|'ve|'m|'ll|'d)? at code point e: where it ends (e when absent). Case-insensitive
// in Unicode's sense: a letter matches when its simple case fold is the ASCII letter, so U+017F
// LONG S counts as 's'. Only ASCII U+0027 is an apostrophe.
size_t contraction(const DecodedText& t, size_t e, size_t end) {
  if (e + 1 >= end || byte_at(t, e) != '\'') return e;
  const uint32_t a = u_foldCase(code_point(t, e + 1), U_FOLD_CASE_DEFAULT);
  if (a == 's' || a == 't' || a == 'm' || a == 'd') return e + 2;
  if (e + 2 >= end || (a != 'r' && a != 'v' && a != 'l')) return e;
  const uint32_t b = u_foldCase(code_point(t, e + 2), U_FOLD_CASE_DEFAULT);
  return (b == 'e' && a != 'l') || (b == 'l' && a == 'l') ? e + 3 : e;
}

template <bool kKimi>
size_t piece_end_impl(const DecodedText& t, size_t i, size_t end) {
  const uint8_t* c = t.cls.data();
  auto run = [&](size_t k, uint8_t bits) {
    while (k < end && (c[k] & bits)) ++k;
    return k;
  };
  const uint8_t c0 = c[i];

  // Kimi only: [\p{Han}]+
  if (kKimi && (c0 & kHan)) return run(i + 1, kHan);

  // Branch "lower": P? [U]* [W]+ C?, with P = [^\r\n\p{L}\p{N}], U = Lu|Lt|Lm|Lo|M, W = Ll|Lm|Lo|M.
  // W+ and C? cannot fail once W+ has one code point, so the first way to place W+ wins: U* takes
  // its longest run, then gives back code points until one that is in W starts W+ (Lm, Lo and M
  // are in both classes). Returns 0 when no placement works (a match never ends at 0).
  auto lower = [&](size_t s) -> size_t {
    if (s >= end) return 0;
    size_t k = run(s, kUpperish);
    if (!(k < end && (c[k] & kLowerish))) {
      while (k > s && !(c[k - 1] & kLowerish)) --k;
      if (k == s) return 0;
      --k;
    }
    return run(k + 1, kLowerish);
  };
  // P is optional and greedy: the branch is tried with it first, then without (P includes marks,
  // which are also letters of U and W, so dropping it can change the result).
  const bool p = !(c0 & (kCrLf | kLetter | kNumber));
  if (p)
    if (const size_t e = lower(i + 1)) return contraction(t, e, end);
  if (const size_t e = lower(i)) return contraction(t, e, end);

  // Branch "upper": P? [U]+ [W]* C?: nothing after U+ can fail, so the longest runs win.
  if (p && i + 1 < end && (c[i + 1] & kUpperish))
    return contraction(t, run(run(i + 1, kUpperish), kLowerish), end);
  if (c0 & kUpperish) return contraction(t, run(run(i, kUpperish), kLowerish), end);

  // \p{N}{1,3}
  if (c0 & kNumber) {
    size_t e = i + 1;
    while (e < end && e < i + 3 && (c[e] & kNumber)) ++e;
    return e;
  }

  // " ?[^\s\p{L}\p{N}]+" then [\r\n]* (Kimi) or [\r\n/]* (o200k). The optional space is U+0020
  // only; a space is not in the class, so without a class code point after it the branch fails.
  constexpr uint8_t kNotPunct = kSpace | kLetter | kNumber;
  size_t s = i;
  if (byte_at(t, i) == ' ' && i + 1 < end && !(c[i + 1] & kNotPunct)) s = i + 1;
  if (!(c[s] & kNotPunct)) {
    size_t e = s + 1;
    while (e < end && !(c[e] & kNotPunct)) ++e;
    // '/' is in the class, so o200k's extra '/' can only follow a CR or LF here.
    while (e < end && ((c[e] & kCrLf) || (!kKimi && byte_at(t, e) == '/'))) ++e;
    return e;
  }

  // What is left starts with \s (every other code point is a letter, mark, number or in the class
  // above), so c0 opens the whitespace run [i, e).
  size_t e = i + 1, last_crlf = (c0 & kCrLf) ? i : end;
  for (; e < end && (c[e] & kSpace); ++e)
    if (c[e] & kCrLf) last_crlf = e;
  // \s*[\r\n]+: \s* gives back until a CR/LF can follow, so the match ends after the run's last one.
  if (last_crlf != end) return last_crlf + 1;
  // \s+(?!\S): the whole run at the end of input, else the run less its last code point (which is
  // then followed by whitespace). A one-code-point run before non-space fails that and is \s+.
  if (e < end && e - i >= 2) return e - 1;
  return e;
}

}  // namespace

size_t piece_end(const DecodedText& t, size_t i, size_t end, Pattern pattern) {
  return pattern == Pattern::kimi ? piece_end_impl<true>(t, i, end) : piece_end_impl<false>(t, i, end);
}

}  // namespace k3::io::text
