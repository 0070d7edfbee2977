// Per-code-point character classes the pre-tokenizer and Moonshot's chunking test: one byte per
// code point, taken from ICU's Unicode data once per process (never hand-copied tables).
#pragma once
#include <cstdint>

namespace k3::io::text {

// Bits of a code point's class byte.
enum CharClass : uint8_t {
  kUpperish = 1 << 0,  // Lu | Lt | Lm | Lo | M: the pattern's first letter class
  kLowerish = 1 << 1,  // Ll | Lm | Lo | M: the pattern's second letter class
  kLetter = 1 << 2,    // \p{L}
  kNumber = 1 << 3,    // \p{N}
  kHan = 1 << 4,       // Script=Han (not Script_Extensions)
  kSpace = 1 << 5,     // \s: Unicode White_Space
  kPySpace = 1 << 6,   // Python str.isspace: bidi class WS, B or S, or general category Zs
  kCrLf = 1 << 7,      // U+000D or U+000A
};

// Two-level lookup: the class of cp is blocks[stage1[cp >> 8] * 256 + (cp & 0xFF)]. Identical
// 256-code-point blocks are stored once, so the table is small (the unassigned planes share one).
struct ClassTable {
  const uint16_t* stage1;
  const uint8_t* blocks;

  uint8_t operator()(uint32_t cp) const { return blocks[(uint32_t(stage1[cp >> 8]) << 8) | (cp & 0xFF)]; }
};

// The process-wide table, built from ICU by the first call (thread-safe; well under a millisecond,
// since it walks ICU's property ranges rather than every code point).
const ClassTable& char_classes();

}  // namespace k3::io::text
