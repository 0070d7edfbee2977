// The OpenAI-compatible request and response bodies of `k3flow serve`: requests parsed with
// simdjson into the scheduler's GenRequest (or an ApiError naming the field), responses and
// Server-Sent-Event chunks written with io::JsonWriter in OpenAI's shapes (id, object, created,
// model, choices[...], usage). No HTTP here: http.cpp moves these strings.
//
// Accepted fields (docs/serve.md has the table): model (must name the served model when given),
// prompt and echo (completions), messages (chat: system, developer, user, assistant with
// reasoning_content and tool_calls, tool with tool_call_id), tools, tool_choice and
// parallel_tool_calls (chat), max_tokens (or max_completion_tokens; capped by --max-reply),
// temperature (0..2; 0 = greedy), top_p, top_k, min_p, seed, stop (a string or up to 4), stream,
// stream_options.include_usage, reasoning_effort (low|high|max) and thinking (false: no think
// channel; default serve --thinking) for chat, n (1 only), user (accepted, no effect);
// presence_penalty, frequency_penalty, logprobs (+ top_logprobs), response_format
// (api_sampling.hpp). Extensions: return_token_ids (each choice and chunk also carries the
// generated ids), ignore_eos. Any other field is refused with a 400 naming it.
#pragma once
#include <cstdint>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "io/json_text.hpp"
#include "io/text/tokenizer.hpp"
#include "pipeline/serve/channel.hpp"
#include "pipeline/serve/scheduler.hpp"

namespace k3::pipeline::serve {

// An answer other than 200: the status and OpenAI's error object {"error":{"message","type"}}.
struct ApiError : std::runtime_error {
  ApiError(int s, std::string t, const std::string& m)
      : std::runtime_error(m), status(s), type(std::move(t)) {}
  int status;
  std::string type;  // invalid_request_error, authentication_error, not_found_error, ...
};
std::string error_body(const ApiError&);

enum class Endpoint { completions, chat };

struct ApiRequest {
  Endpoint endpoint = Endpoint::completions;
  GenRequest gen;
  bool stream = false, include_usage = false, token_ids = false;
  std::string echo;  // completions with echo: the prompt, written before the generated text
};

struct ApiContext {
  std::string model;  // the served model's name
  const io::text::Tokenizer& tok;
  size_t capacity;  // positions per sequence
  // Chat requests that do not say: thinking on or off (serve --thinking). Every request's
  // max_tokens: the default for chat and the cap for both endpoints (serve --max-reply).
  bool thinking = true;
  int max_reply = 512;
};

// Throws ApiError (400; 404 for another model) naming the offending field.
ApiRequest parse_request(Endpoint, std::string_view body, const ApiContext&);

// One request's response, built as the scheduler's deltas arrive.
class ResponseBuilder {
 public:
  ResponseBuilder(const ApiRequest&, std::string model, std::string id, int64_t created);

  // Streaming: the SSE event(s) for a delta ("data: {...}\n\n"); empty when the delta has nothing to
  // show. The first chat event also carries role "assistant".
  std::string event(const Delta&);
  // Streaming, at the end: the last chunk (finish_reason), the usage chunk if asked, "data: [DONE]".
  std::string final_events(const Outcome&);
  // Not streaming: accumulate, then the whole body.
  void add(const Delta&);
  std::string body(const Outcome&) const;

 private:
  std::string chunk(const Delta* d, const char* finish_reason, bool role) const;
  // Opens the response object and writes the fields every response and chunk starts with.
  void envelope(io::JsonWriter&, const char* object) const;
  void usage(io::JsonWriter&, const Outcome&) const;

  const ApiRequest& req_;
  std::string model_, id_;
  int64_t created_;
  // Chat: the call's id, as the response and its chunks name it.
  std::string call_id(size_t index) const;

  bool sent_role_ = false, sent_echo_ = false;
  std::string text_, reasoning_;
  std::vector<int32_t> ids_;
  std::vector<TokenLogprobs> logprobs_;
  mutable size_t logprob_offset_ = 0;  // streamed completions: text_offset of the next token
  std::vector<CallDelta> calls_;
  size_t streamed_calls_ = 0;
};

std::string models_body(const std::string& model, int64_t created);
std::string model_body(const std::string& model, int64_t created);  // GET /v1/models/{id}
const char* finish_reason(Finish);  // stop / length (cancelled and error never reach a client body)
// A chat reply that made calls and stopped by itself: "tool_calls"; otherwise finish_reason(f).
const char* finish_reason(Finish, bool made_calls);

}  // namespace k3::pipeline::serve
