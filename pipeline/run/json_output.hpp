// What JSON-constrained sampling (stages/json_constraint.hpp) needs from the model's tokenizer:
// every id's bytes, which ids are control tokens, which end the turn -- and, for a chat reply, the
// closing markers that follow the JSON value. Shared by `generate --json-*` and `serve`'s
// response_format.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "io/text/tokenizer.hpp"
#include "stages/json_constraint.hpp"

namespace k3::pipeline {

// Ids 0..model_vocab-1; ids the tokenizer lacks (padding rows) have no bytes and are never allowed.
// `end_ids`: the turn's end ids (empty when the generation ignores them).
std::shared_ptr<const stages::TokenTable> json_token_table(const io::text::Tokenizer&, int32_t model_vocab,
                                                           std::vector<int32_t> end_ids);

// A chat reply with thinking off is REPLY then the closing sequence then an end id; the JSON value
// is the reply, so the closing sequence is the constraint's epilogue (io/text/xtml.hpp).
std::string chat_reply_epilogue();

}  // namespace k3::pipeline
