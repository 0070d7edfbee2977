// JSON-constrained sampling: a byte automaton that accepts exactly the JSON texts matching a
// compiled schema (stages/json_schema.hpp), and the token mask it induces over a vocabulary -- the
// ids whose bytes can all be fed from the current state. The sampler sets every other logit to
// -inf before its own order of operations (docs/sampling.md, "JSON output").
//
// Everything is deterministic and sequential: the mask depends only on the schema, the ids
// accepted so far and the vocabulary, never on threads or ISA.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "stages/json_schema.hpp"
#include "stages/sampler.hpp"

namespace k3::stages {

// The vocabulary as the mask needs it: every id's bytes, ordinary ids sorted bytewise with the
// length of the prefix each shares with the one before (so the mask walks shared prefixes once),
// the special ids apart (allowed only where the text after the value spells their text), and the
// ids that end the turn. Immutable; built once per tokenizer and shared.
class TokenTable {
 public:
  // bytes[id]: the id's bytes (a special's text); special[id]: a control token; end_ids: ids that
  // end the turn (allowed once the value and the epilogue are complete).
  TokenTable(std::vector<std::string> bytes, std::vector<bool> special, std::vector<int32_t> end_ids);

  size_t size() const { return bytes_.size(); }
  std::string_view bytes(int32_t id) const { return bytes_[size_t(id)]; }
  const std::vector<int32_t>& end_ids() const { return end_ids_; }

 private:
  friend class JsonConstraint;
  std::vector<std::string> bytes_;
  std::vector<int32_t> sorted_;    // ordinary ids, bytewise order of their bytes
  std::vector<uint16_t> shared_;   // shared_[i]: common prefix length of sorted_[i] and sorted_[i-1]
  std::vector<int32_t> specials_;  // special ids that are not end ids
  std::vector<int32_t> end_ids_;
  size_t max_len_ = 0;
};

// The automaton's limits, part of the definition (docs/sampling.md): whitespace between tokens is
// allowed in runs of at most kMaxWhitespaceRun bytes (so a model cannot stall in it), a number has
// at most kMaxNumberBytes bytes, kMaxIntegerDigits digits before the point and kMaxExponentDigits
// exponent digits (so it fits an int64 or a finite double in any parser), and values nest at most
// kMaxJsonDepth deep (a schema-free value may then only be a scalar).
inline constexpr int kMaxWhitespaceRun = 16;
inline constexpr int kMaxNumberBytes = 24;
inline constexpr int kMaxIntegerDigits = 18;
inline constexpr int kMaxExponentDigits = 2;
inline constexpr int kMaxJsonDepth = 32;

class JsonConstraint final : public TokenConstraint {
 public:
  // epilogue: text the output must carry after the value, before an end id (a chat reply's closing
  // markers; empty for plain text).
  JsonConstraint(std::shared_ptr<const JsonSchema>, std::shared_ptr<const TokenTable>,
                 std::string epilogue = {});

  // Bit id of the result is set when id may come next. Results are cached per automaton state.
  std::span<const uint64_t> allowed(size_t vocab) override;
  // Advances by id's bytes; throws io::Error (runtime) for an id the mask did not allow.
  void accept(int32_t id) override;
  // The value (and the epilogue) is complete and nothing but an end id may follow -- or, for a
  // vocabulary without end ids, the value could end here: the caller stops.
  bool done() const override;

  // Byte level, for tests: feed text; false (state unchanged) when it is not a prefix of a match.
  bool feed(std::string_view bytes);
  bool complete() const;  // the text fed so far is a whole match (value and epilogue)

  struct Frame {
    uint64_t used = 0;  // object: the keys used so far
    uint32_t node = 0;
    uint16_t lo = 0, hi = 0, pos = 0;  // literal: candidate range and bytes matched; object: key index
    uint8_t mode = 0, sub = 0, list = 0, aux = 0, aux2 = 0, key = 0;
  };
  struct State {
    Frame frames[kMaxJsonDepth];
    int depth = 0;
    int ws = 0;  // whitespace run
  };

 private:
  bool step(State&, uint8_t c) const;
  bool step_top(State&, uint8_t c) const;
  bool can_end(const State&) const;
  void value_done(State&) const;
  void key_done(State&, int index) const;
  bool push(State&, Frame) const;
  bool start_value(State&, uint8_t c) const;
  bool start_key(State&, Frame& obj, uint8_t c) const;
  bool step_literal(State&, uint8_t c) const;
  const std::vector<std::string>& list(const Frame&) const;
  bool eligible(const State&, const Frame&, size_t i) const;
  bool whitespace(State&, uint8_t c) const;
  void compute(std::vector<uint64_t>& bits, size_t vocab);
  std::string key_of(const State&) const;

  std::shared_ptr<const JsonSchema> schema_;
  std::shared_ptr<const TokenTable> table_;
  std::string epilogue_;
  State state_;
  std::vector<State> walk_;  // one state per prefix length while the mask is computed
  std::unordered_map<std::string, std::vector<uint64_t>> cache_;
  std::vector<std::string> cache_order_;
  std::vector<uint64_t> none_;
};

}  // namespace k3::stages
