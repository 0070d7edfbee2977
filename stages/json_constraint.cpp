#include "stages/json_constraint.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <numeric>

#include "io/error.hpp"

namespace k3::stages {

namespace {

enum Mode : uint8_t { kRoot, kValue, kLiteral, kString, kNumber, kObject, kArray };
// Root: the value is being written / is complete (then pos counts the epilogue bytes matched).
enum : uint8_t { kRootInValue, kRootAfter };
enum : uint8_t { kObjOpen, kObjKey, kObjInValue, kObjAfter, kObjComma };
enum : uint8_t { kArrOpen, kArrInValue, kArrAfter };
enum : uint8_t { kStrNormal, kStrEscape, kStrHex, kStrUtf8 };
enum : uint8_t { kNumMinus, kNumZero, kNumInt, kNumDot, kNumFrac, kNumExp, kNumExpSign, kNumExpDigits };
enum : uint8_t { kListEnum, kListKeys, kListBuiltin };

const std::vector<std::string> kBuiltins = {"false", "null", "true"};

bool is_ws(uint8_t c) {
  return c == ' ' || c == '\n' || c == '\r' || c == '\t';
}
bool is_digit(uint8_t c) {
  return c >= '0' && c <= '9';
}
bool is_hex(uint8_t c) {
  return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}
bool number_accepting(uint8_t sub) {
  return sub == kNumZero || sub == kNumInt || sub == kNumFrac || sub == kNumExpDigits;
}

// UTF-8 (RFC 3629, Table 3-7 of the Unicode standard): which bytes may follow a lead byte. Class
// 0 is any continuation byte 80..BF; the others narrow the first continuation so overlong forms,
// surrogates and code points above U+10FFFF are never written.
bool in_class(uint8_t c, uint8_t cls) {
  switch (cls) {
    case 1:
      return c >= 0xA0 && c <= 0xBF;
    case 2:
      return c >= 0x80 && c <= 0x9F;
    case 3:
      return c >= 0x90 && c <= 0xBF;
    case 4:
      return c >= 0x80 && c <= 0x8F;
    default:
      return c >= 0x80 && c <= 0xBF;
  }
}

void copy_state(JsonConstraint::State& dst, const JsonConstraint::State& src) {
  dst.depth = src.depth;
  dst.ws = src.ws;
  std::memcpy(dst.frames, src.frames, sizeof(JsonConstraint::Frame) * size_t(src.depth));
}

}  // namespace

TokenTable::TokenTable(std::vector<std::string> bytes, std::vector<bool> special,
                       std::vector<int32_t> end_ids)
    : bytes_(std::move(bytes)), end_ids_(std::move(end_ids)) {
  special.resize(bytes_.size(), false);
  for (size_t id = 0; id < bytes_.size(); ++id) {
    const bool end = std::find(end_ids_.begin(), end_ids_.end(), int32_t(id)) != end_ids_.end();
    if (end) continue;
    if (special[id])
      specials_.push_back(int32_t(id));
    else if (!bytes_[id].empty())
      sorted_.push_back(int32_t(id));
  }
  std::sort(sorted_.begin(), sorted_.end(), [&](int32_t a, int32_t b) {
    return bytes_[size_t(a)] < bytes_[size_t(b)] || (bytes_[size_t(a)] == bytes_[size_t(b)] && a < b);
  });
  shared_.resize(sorted_.size(), 0);
  for (size_t i = 0; i < sorted_.size(); ++i) {
    const std::string& b = bytes_[size_t(sorted_[i])];
    max_len_ = std::max(max_len_, b.size());
    if (i == 0) continue;
    const std::string& p = bytes_[size_t(sorted_[i - 1])];
    size_t n = 0;
    while (n < b.size() && n < p.size() && b[n] == p[n] && n < 0xFFFF) ++n;
    shared_[i] = uint16_t(n);
  }
}

JsonConstraint::JsonConstraint(std::shared_ptr<const JsonSchema> schema,
                               std::shared_ptr<const TokenTable> table, std::string epilogue)
    : schema_(std::move(schema)), table_(std::move(table)), epilogue_(std::move(epilogue)) {
  state_.frames[0] = Frame{.mode = kRoot, .sub = kRootInValue};
  state_.frames[1] = Frame{.node = schema_->root, .mode = kValue};
  state_.depth = 2;
  walk_.resize(table_->max_len_ + 1);
}

const std::vector<std::string>& JsonConstraint::list(const Frame& f) const {
  if (f.list == kListBuiltin) return kBuiltins;
  const JsonSchemaNode& n = schema_->nodes[f.node];
  return f.list == kListKeys ? n.keys : n.literals;
}

bool JsonConstraint::eligible(const State& s, const Frame& f, size_t i) const {
  if (f.list != kListKeys) return true;
  return !((s.frames[s.depth - 2].used >> i) & 1);
}

bool JsonConstraint::push(State& s, Frame f) const {
  if (s.depth >= kMaxJsonDepth) return false;
  s.frames[s.depth++] = f;
  return true;
}

bool JsonConstraint::whitespace(State& s, uint8_t) const {
  return ++s.ws <= kMaxWhitespaceRun;
}

void JsonConstraint::value_done(State& s) const {
  --s.depth;
  Frame& p = s.frames[s.depth - 1];
  switch (p.mode) {
    case kRoot:
      p.sub = kRootAfter;
      p.pos = 0;
      break;
    case kObject:
      p.sub = kObjAfter;
      break;
    case kArray:
      p.sub = kArrAfter;
      break;
    default:
      break;
  }
}

void JsonConstraint::key_done(State& s, int index) const {
  --s.depth;
  Frame& obj = s.frames[s.depth - 1];
  if (index >= 0) {
    obj.used |= uint64_t(1) << index;
    obj.pos = uint16_t(index);
  }
  obj.sub = kObjKey;
}

bool JsonConstraint::start_key(State& s, Frame& obj, uint8_t c) const {
  if (c != '"') return false;
  const JsonSchemaNode& n = schema_->nodes[obj.node];
  if (!n.closed) return push(s, Frame{.mode = kString, .sub = kStrNormal, .key = 1});
  if (!push(
          s,
          Frame{
              .node = obj.node, .lo = 0, .hi = uint16_t(n.keys.size()), .mode = kLiteral, .list = kListKeys}))
    return false;
  return step_literal(s, c);
}

bool JsonConstraint::step_literal(State& s, uint8_t c) const {
  Frame& f = s.frames[s.depth - 1];
  const std::vector<std::string>& L = list(f);
  size_t lo = f.lo;
  while (lo < f.hi && !(L[lo].size() > f.pos && uint8_t(L[lo][f.pos]) == c)) ++lo;
  size_t hi = lo;
  bool any = false;
  while (hi < f.hi && L[hi].size() > f.pos && uint8_t(L[hi][f.pos]) == c) {
    any = any || eligible(s, f, hi);
    ++hi;
  }
  if (any) {
    f.lo = uint16_t(lo);
    f.hi = uint16_t(hi);
    ++f.pos;
    s.ws = 0;
    // Complete once the one candidate left is matched whole; while a longer one could still
    // follow (enum 1 and 12), the next byte decides.
    if (hi - lo == 1 && L[lo].size() == f.pos) {
      if (f.list == kListKeys)
        key_done(s, int(lo));
      else
        value_done(s);
    }
    return true;
  }
  // No candidate continues with c: a candidate matched whole ends here and c belongs to the parent.
  if (f.pos > 0 && L[f.lo].size() == f.pos && eligible(s, f, f.lo)) {
    if (f.list == kListKeys)
      key_done(s, int(f.lo));
    else
      value_done(s);
    return step(s, c);
  }
  return false;
}

bool JsonConstraint::start_value(State& s, uint8_t c) const {
  Frame& f = s.frames[s.depth - 1];
  const JsonSchemaNode& n = schema_->nodes[f.node];
  if (is_ws(c)) return whitespace(s, c);
  if (!n.literals.empty()) {
    f = Frame{
        .node = f.node, .lo = 0, .hi = uint16_t(n.literals.size()), .mode = kLiteral, .list = kListEnum};
    return step_literal(s, c);
  }
  // A container needs a frame for its child.
  const bool room = s.depth < kMaxJsonDepth;
  switch (c) {
    case '{':
      if (!(n.types & kJsonObject) || !room) return false;
      f = Frame{.node = f.node, .mode = kObject, .sub = kObjOpen};
      return true;
    case '[':
      if (!(n.types & kJsonArray) || !room) return false;
      f = Frame{.node = f.node, .mode = kArray, .sub = kArrOpen};
      return true;
    case '"':
      if (!(n.types & kJsonString)) return false;
      f = Frame{.node = f.node, .mode = kString, .sub = kStrNormal};
      return true;
    case 't':
    case 'f':
    case 'n': {
      if (!(n.types & (c == 'n' ? kJsonNull : kJsonBoolean))) return false;
      f = Frame{
          .node = f.node, .lo = 0, .hi = uint16_t(kBuiltins.size()), .mode = kLiteral, .list = kListBuiltin};
      return step_literal(s, c);
    }
    default:
      break;
  }
  if (c == '-' || is_digit(c)) {
    if (!(n.types & (kJsonNumber | kJsonInteger))) return false;
    const uint8_t integer = (n.types & kJsonNumber) ? 0 : 1;
    f = Frame{.node = f.node,
              .lo = uint16_t(is_digit(c) ? 1 : 0),
              .mode = kNumber,
              .sub = c == '-'   ? kNumMinus
                     : c == '0' ? kNumZero
                                : kNumInt,
              .aux = 1,
              .aux2 = integer};
    return true;
  }
  return false;
}

bool JsonConstraint::step(State& s, uint8_t c) const {
  if (!is_ws(c)) s.ws = 0;
  Frame& f = s.frames[s.depth - 1];
  switch (f.mode) {
    case kRoot: {
      if (f.pos == 0 && is_ws(c)) return whitespace(s, c);
      if (f.pos < epilogue_.size() && uint8_t(epilogue_[f.pos]) == c) {
        ++f.pos;
        return true;
      }
      return false;
    }
    case kValue:
      return start_value(s, c);
    case kLiteral:
      return step_literal(s, c);
    case kString:
      s.ws = 0;
      switch (f.sub) {
        case kStrNormal:
          if (c == '"') {
            if (f.key)
              key_done(s, -1);
            else
              value_done(s);
            return true;
          }
          if (c == '\\') {
            f.sub = kStrEscape;
            return true;
          }
          if (c < 0x20) return false;
          if (c < 0x80) return true;
          if (c >= 0xC2 && c <= 0xDF) {
            f.sub = kStrUtf8;
            f.aux = 1;
            f.aux2 = 0;
            return true;
          }
          if (c >= 0xE0 && c <= 0xEF) {
            f.sub = kStrUtf8;
            f.aux = 2;
            f.aux2 = c == 0xE0 ? 1 : c == 0xED ? 2 : 0;
            return true;
          }
          if (c >= 0xF0 && c <= 0xF4) {
            f.sub = kStrUtf8;
            f.aux = 3;
            f.aux2 = c == 0xF0 ? 3 : c == 0xF4 ? 4 : 0;
            return true;
          }
          return false;
        case kStrEscape:
          if (c == 'u') {
            f.sub = kStrHex;
            f.aux = 4;
            return true;
          }
          if (std::strchr("\"\\/bfnrt", c) == nullptr || c == 0) return false;
          f.sub = kStrNormal;
          return true;
        case kStrHex:
          if (!is_hex(c)) return false;
          if (--f.aux == 0) f.sub = kStrNormal;
          return true;
        default:  // kStrUtf8
          if (!in_class(c, f.aux2)) return false;
          f.aux2 = 0;
          if (--f.aux == 0) f.sub = kStrNormal;
          return true;
      }
    case kNumber: {
      // lo: digits before the point, hi: exponent digits (bounded so every number fits an int64
      // or a finite double); aux: bytes so far.
      const bool integer = f.aux2 != 0;
      uint8_t next = 0xFF;
      switch (f.sub) {
        case kNumMinus:
          if (is_digit(c)) next = c == '0' ? kNumZero : kNumInt;
          break;
        case kNumZero:
        case kNumInt:
          if (f.sub == kNumInt && is_digit(c))
            next = kNumInt;
          else if (c == '.' && !integer)
            next = kNumDot;
          else if ((c == 'e' || c == 'E') && !integer)
            next = kNumExp;
          break;
        case kNumDot:
          if (is_digit(c)) next = kNumFrac;
          break;
        case kNumFrac:
          if (is_digit(c))
            next = kNumFrac;
          else if (c == 'e' || c == 'E')
            next = kNumExp;
          break;
        case kNumExp:
          if (c == '+' || c == '-')
            next = kNumExpSign;
          else if (is_digit(c))
            next = kNumExpDigits;
          break;
        default:  // kNumExpSign, kNumExpDigits
          if (is_digit(c)) next = kNumExpDigits;
          break;
      }
      if (next != 0xFF) {
        if (f.aux >= kMaxNumberBytes) return false;
        if (next == kNumInt && ++f.lo > kMaxIntegerDigits) return false;
        if (next == kNumExpDigits && ++f.hi > kMaxExponentDigits) return false;
        ++f.aux;
        f.sub = next;
        return true;
      }
      // Not part of the number: it ends here if it can, and c belongs to the parent.
      if (!number_accepting(f.sub)) return false;
      value_done(s);
      return step(s, c);
    }
    case kObject: {
      const JsonSchemaNode& n = schema_->nodes[f.node];
      if (is_ws(c)) return whitespace(s, c);
      const bool can_close = (n.required & ~f.used) == 0;
      switch (f.sub) {
        case kObjOpen:
          if (c == '}' && can_close) {
            value_done(s);
            return true;
          }
          return start_key(s, f, c);
        case kObjKey:
          if (c != ':') return false;
          f.sub = kObjInValue;
          return push(s, Frame{.node = n.closed ? n.key_node[f.pos] : 0u, .mode = kValue});
        case kObjAfter:
          if (c == '}' && can_close) {
            value_done(s);
            return true;
          }
          if (c != ',') return false;
          if (n.closed && f.used == (n.keys.size() == 64 ? ~uint64_t(0) : (uint64_t(1) << n.keys.size()) - 1))
            return false;
          f.sub = kObjComma;
          return true;
        case kObjComma:
          return start_key(s, f, c);
        default:
          return false;
      }
    }
    case kArray: {
      if (is_ws(c)) return whitespace(s, c);
      const uint32_t items = schema_->nodes[f.node].items;
      switch (f.sub) {
        case kArrOpen:
          if (c == ']') {
            value_done(s);
            return true;
          }
          f.sub = kArrInValue;
          if (!push(s, Frame{.node = items, .mode = kValue})) return false;
          return step(s, c);
        case kArrAfter:
          if (c == ']') {
            value_done(s);
            return true;
          }
          if (c != ',') return false;
          f.sub = kArrInValue;
          return push(s, Frame{.node = items, .mode = kValue});
        default:
          return false;
      }
    }
    default:
      return false;
  }
}

bool JsonConstraint::can_end(const State& st) const {
  State s;
  copy_state(s, st);
  for (;;) {
    const Frame& f = s.frames[s.depth - 1];
    if (f.mode == kNumber && number_accepting(f.sub)) {
      value_done(s);
      continue;
    }
    if (f.mode == kLiteral && f.list != kListKeys && f.pos > 0 && list(f)[f.lo].size() == f.pos) {
      value_done(s);
      continue;
    }
    return f.mode == kRoot && f.sub == kRootAfter && f.pos == epilogue_.size();
  }
}

bool JsonConstraint::feed(std::string_view bytes) {
  State s;
  copy_state(s, state_);
  for (char c : bytes)
    if (!step(s, uint8_t(c))) return false;
  copy_state(state_, s);
  return true;
}

bool JsonConstraint::complete() const {
  return can_end(state_);
}

bool JsonConstraint::done() const {
  return table_->end_ids().empty() && can_end(state_);
}

std::string JsonConstraint::key_of(const State& s) const {
  std::string k(sizeof(Frame) * size_t(s.depth) + 2, '\0');
  std::memcpy(k.data(), s.frames, sizeof(Frame) * size_t(s.depth));
  k[k.size() - 2] = char(s.ws);
  k[k.size() - 1] = char(s.depth);
  return k;
}

void JsonConstraint::compute(std::vector<uint64_t>& bits, size_t vocab) {
  bits.assign((vocab + 63) / 64, 0);
  const auto allow = [&](int32_t id) {
    if (size_t(id) < vocab) bits[size_t(id) / 64] |= uint64_t(1) << (size_t(id) % 64);
  };
  const TokenTable& t = *table_;
  copy_state(walk_[0], state_);
  // walk_[0..good] hold the states after the first `good` bytes of the previous id; an id that
  // shares more than `good` bytes with it shares the byte that failed.
  size_t good = 0;
  for (size_t i = 0; i < t.sorted_.size(); ++i) {
    const int32_t id = t.sorted_[i];
    const std::string& b = t.bytes_[size_t(id)];
    const size_t shared = t.shared_[i];
    if (shared > good) continue;
    size_t d = shared;
    for (; d < b.size(); ++d) {
      copy_state(walk_[d + 1], walk_[d]);
      if (!step(walk_[d + 1], uint8_t(b[d]))) break;
    }
    good = d;
    if (d == b.size()) allow(id);
  }
  for (int32_t id : t.specials_) {
    State s;
    copy_state(s, state_);
    bool ok = true;
    for (char c : t.bytes_[size_t(id)]) {
      ok = step(s, uint8_t(c));
      if (!ok) break;
    }
    if (ok) allow(id);
  }
  if (can_end(state_))
    for (int32_t id : t.end_ids_) allow(id);
}

std::span<const uint64_t> JsonConstraint::allowed(size_t vocab) {
  std::string key = key_of(state_);
  if (auto it = cache_.find(key); it != cache_.end() && it->second.size() == (vocab + 63) / 64)
    return it->second;
  constexpr size_t kCacheStates = 64;
  if (cache_order_.size() >= kCacheStates) {
    cache_.erase(cache_order_.front());
    cache_order_.erase(cache_order_.begin());
  }
  std::vector<uint64_t> bits;
  compute(bits, vocab);
  if (std::all_of(bits.begin(), bits.end(), [](uint64_t w) { return w == 0; }))
    throw io::runtime_error("json constraint: no token of the vocabulary can continue the JSON value");
  cache_order_.push_back(key);
  return cache_[key] = std::move(bits);
}

void JsonConstraint::accept(int32_t id) {
  const TokenTable& t = *table_;
  if (id < 0 || size_t(id) >= t.size())
    throw io::runtime_error(fmt::format("json constraint: id {} is outside the vocabulary", id));
  if (std::find(t.end_ids_.begin(), t.end_ids_.end(), id) != t.end_ids_.end()) {
    if (!can_end(state_))
      throw io::runtime_error(fmt::format("json constraint: end id {} before the value is complete", id));
    return;
  }
  if (!feed(t.bytes_[size_t(id)]))
    throw io::runtime_error(fmt::format("json constraint: id {} cannot continue the JSON value", id));
}

}  // namespace k3::stages
