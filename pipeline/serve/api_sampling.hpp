// The request fields that shape sampling beyond the basic ones, and the logprobs they ask for:
// presence_penalty / frequency_penalty, logprobs (+ top_logprobs in chat), response_format
// (json_object / json_schema: JSON-constrained sampling, docs/sampling.md). Kept apart from api.cpp's
// message and prompt parsing.
#pragma once
#include <simdjson.h>

#include <span>

#include "io/json_text.hpp"
#include "pipeline/serve/api.hpp"

namespace k3::pipeline::serve {

inline constexpr int kMaxTopLogprobs = 20;
// JSON has no -inf: a logprob below this (a -inf logit) is written as this, as OpenAI does.
inline constexpr double kLogprobFloor = -9999.0;

// Reads the fields into r.gen (sampling options, logprobs, json). Throws ApiError (400) naming the
// field, or for a schema the keyword outside the subset. Call before the prompt is rendered: a JSON
// chat reply is rendered with thinking off.
void parse_sampling_fields(simdjson::dom::object o, Endpoint ep, ApiRequest& r);

// The value of a choice's "logprobs" for these tokens, in OpenAI's shape: chat {"content":[{token,
// logprob, bytes, top_logprobs}], "refusal": null}; completions {tokens, token_logprobs,
// top_logprobs, text_offset} with offsets counted from `text_offset`, which advances.
void write_logprobs(io::JsonWriter& w, Endpoint ep, std::span<const TokenLogprobs> tokens,
                    size_t& text_offset);

}  // namespace k3::pipeline::serve
