#include "io/text/unicode_classes.hpp"

#include <unicode/uchar.h>
#include <unicode/uscript.h>
#include <unicode/uset.h>

#include <cstring>
#include <initializer_list>
#include <map>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace k3::io::text {
namespace {

constexpr uint32_t kCodePoints = 0x110000;

uint8_t category_bits(UCharCategory c) {
  switch (c) {
    case U_UPPERCASE_LETTER:
    case U_TITLECASE_LETTER:
      return kLetter | kUpperish;
    case U_LOWERCASE_LETTER:
      return kLetter | kLowerish;
    case U_MODIFIER_LETTER:
    case U_OTHER_LETTER:
      return kLetter | kUpperish | kLowerish;
    case U_NON_SPACING_MARK:
    case U_ENCLOSING_MARK:
    case U_COMBINING_SPACING_MARK:
      return kUpperish | kLowerish;
    case U_DECIMAL_DIGIT_NUMBER:
    case U_LETTER_NUMBER:
    case U_OTHER_NUMBER:
      return kNumber;
    case U_SPACE_SEPARATOR:
      return kPySpace;  // Zs counts for str.isspace
    default:
      return 0;
  }
}

UBool U_CALLCONV on_category_range(const void* ctx, UChar32 start, UChar32 limit, UCharCategory c) {
  auto* flat = static_cast<uint8_t*>(const_cast<void*>(ctx));
  const uint8_t bits = category_bits(c);
  if (bits) std::memset(flat + start, bits, size_t(limit - start));
  return true;
}

void check(UErrorCode ec, const char* what) {
  if (U_FAILURE(ec)) throw std::runtime_error(std::string("ICU: ") + what + ": " + u_errorName(ec));
}

// Sets `bit` on every code point of `set` (code point ranges only; property sets hold no strings).
void mark_set(uint8_t* flat, const USet* set, uint8_t bit) {
  for (int32_t i = 0, n = uset_getItemCount(set); i < n; ++i) {
    UChar32 lo = 0, hi = 0;
    UErrorCode ec = U_ZERO_ERROR;
    if (uset_getItem(set, i, &lo, &hi, nullptr, 0, &ec) != 0) continue;
    for (UChar32 cp = lo; cp <= hi; ++cp) flat[cp] |= bit;
  }
}

// Sets `bit` on every code point whose int property `prop` has one of `values`. A USet built from
// the property walks ICU's property boundaries, far cheaper than a whole-range property map.
void mark_int_property(uint8_t* flat, UProperty prop, std::initializer_list<int32_t> values, uint8_t bit) {
  USet* set = uset_openEmpty();
  for (const int32_t v : values) {
    USet* one = uset_openEmpty();
    UErrorCode ec = U_ZERO_ERROR;
    uset_applyIntPropertyValue(one, prop, v, &ec);
    check(ec, "uset_applyIntPropertyValue");
    uset_addAll(set, one);
    uset_close(one);
  }
  mark_set(flat, set, bit);
  uset_close(set);
}

struct Built {
  std::vector<uint16_t> stage1;
  std::vector<uint8_t> blocks;
  ClassTable table;

  Built() {
    std::vector<uint8_t> flat(kCodePoints, 0);
    u_enumCharTypes(on_category_range, flat.data());

    // Script=Han, the Script property proper (what uscript_getScript returns), not the extensions.
    mark_int_property(flat.data(), UCHAR_SCRIPT, {USCRIPT_HAN}, kHan);
    mark_int_property(flat.data(), UCHAR_BIDI_CLASS,
                      {U_WHITE_SPACE_NEUTRAL, U_BLOCK_SEPARATOR, U_SEGMENT_SEPARATOR}, kPySpace);
    UErrorCode ec = U_ZERO_ERROR;
    const USet* ws = u_getBinaryPropertySet(UCHAR_WHITE_SPACE, &ec);
    check(ec, "u_getBinaryPropertySet(White_Space)");
    mark_set(flat.data(), ws, kSpace);
    flat['\r'] |= kCrLf;
    flat['\n'] |= kCrLf;

    std::map<std::string_view, uint16_t> seen;  // keys point into flat, which outlives the loop
    stage1.resize(kCodePoints >> 8);
    blocks.reserve(64 * 256);
    for (uint32_t b = 0; b < stage1.size(); ++b) {
      const std::string_view block(reinterpret_cast<const char*>(flat.data()) + (b << 8), 256);
      auto [it, fresh] = seen.emplace(block, uint16_t(blocks.size() >> 8));
      if (fresh) blocks.insert(blocks.end(), flat.begin() + (b << 8), flat.begin() + ((b + 1) << 8));
      stage1[b] = it->second;
    }
    table = ClassTable{stage1.data(), blocks.data()};
  }
};

}  // namespace

const ClassTable& char_classes() {
  static const Built built;
  return built.table;
}

}  // namespace k3::io::text
