#include "io/text/utf8.hpp"

namespace k3::io::text {
namespace {

constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD

// How many bytes of the sequence led by s[i] are a valid prefix of some well-formed sequence
// (stopping at the first byte out of its allowed range or at the end of input), and how long the
// full sequence would be. A lead byte that can start nothing gives {0, 0}.
struct Prefix {
  size_t valid;
  size_t need;
};

Prefix valid_prefix(const unsigned char* s, size_t n, size_t i) {
  const unsigned b0 = s[i];
  size_t need = 0;
  unsigned lo = 0x80, hi = 0xBF;  // the allowed range of the second byte
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 3;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 4;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
  } else {
    return {0, 0};
  }
  size_t k = 1;
  for (; k < need && i + k < n; ++k) {
    const unsigned b = s[i + k];
    const bool ok = k == 1 ? (b >= lo && b <= hi) : (b >= 0x80 && b <= 0xBF);
    if (!ok) break;
  }
  return {k, need};
}

}  // namespace

std::optional<size_t> first_invalid_utf8(std::string_view text) {
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  size_t i = 0;
  uint32_t cp = 0;
  while (i < n) {
    if (s[i] < 0x80) {
      ++i;
      continue;
    }
    const size_t len = utf8_decode(s, n, i, cp);
    if (len == 0) return i;
    i += len;
  }
  return std::nullopt;
}

size_t append_replacing(std::string& out, std::string_view bytes, bool final) {
  const auto* s = reinterpret_cast<const unsigned char*>(bytes.data());
  const size_t n = bytes.size();
  size_t i = 0;
  while (i < n) {
    size_t j = i;
    while (j < n && s[j] < 0x80) ++j;
    out.append(bytes.substr(i, j - i));
    i = j;
    if (i == n) break;
    const Prefix p = valid_prefix(s, n, i);
    if (p.need == 0) {  // a byte that can start no sequence
      out.append(kReplacement);
      ++i;
    } else if (p.valid == p.need) {
      out.append(bytes.substr(i, p.need));
      i += p.need;
    } else if (i + p.valid == n && !final) {
      return i;  // incomplete so far, may still complete: hold it
    } else {
      out.append(kReplacement);  // one U+FFFD for the maximal subpart s[i, i + valid)
      i += p.valid;
    }
  }
  return n;
}

}  // namespace k3::io::text
