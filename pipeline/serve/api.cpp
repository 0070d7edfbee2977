#include "pipeline/serve/api.hpp"

#include <fmt/format.h>
#include <simdjson.h>

#include <cmath>

#include "io/error.hpp"
#include "io/json_text.hpp"
#include "io/text/xtml.hpp"
#include "pipeline/serve/api_json.hpp"
#include "pipeline/serve/api_sampling.hpp"

namespace k3::pipeline::serve {

namespace dom = simdjson::dom;
namespace text = io::text;

namespace {

std::vector<int32_t> encode(const text::Tokenizer& tok, std::span<const text::Segment> segs) {
  std::vector<int32_t> ids;
  for (const text::Segment& s : segs) {
    const std::vector<int32_t> part = tok.encode(s.text, s.control);
    ids.insert(ids.end(), part.begin(), part.end());
  }
  return ids;
}

std::vector<int32_t> chat_prompt(dom::object o, const ApiContext& ctx, GenRequest& g) {
  text::ChatOptions opts;
  opts.thinking = ctx.thinking;
  if (auto e = member(o, "thinking")) opts.thinking = as_bool(*e, "thinking");
  if (g.json) {
    // The JSON value is the reply: the think channel is off (docs/serve.md).
    if (auto e = member(o, "thinking"); e && opts.thinking)
      throw bad("'thinking': true and a JSON 'response_format' exclude each other");
    opts.thinking = false;
  }
  if (auto e = member(o, "reasoning_effort")) {
    opts.effort = as_string(*e, "reasoning_effort");
    if (opts.effort != "low" && opts.effort != "high" && opts.effort != "max")
      throw bad(fmt::format("'reasoning_effort' {}: low, high or max", opts.effort));
  }
  g.chat = true;
  g.thinking = opts.thinking;
  parse_tools(o, opts, g);
  const std::vector<text::ChatMessage> msgs = parse_messages(o);
  if (const auto problem = text::check_conversation(msgs, true))
    throw bad(fmt::format("messages[{}]: {}", problem->message - 1, problem->reason));
  try {
    std::vector<text::Segment> segs = text::render(msgs, true, opts);
    // A required or named tool choice: the prompt goes on to open a call; the parser starts after it.
    const std::vector<text::Segment> forced = text::forced_reply(opts);
    g.reply_prefix = text::join(forced);
    segs.insert(segs.end(), forced.begin(), forced.end());
    return encode(ctx.tok, segs);
  } catch (const io::Error& err) {
    throw bad(err.what());
  }
}

std::vector<int32_t> completion_prompt(dom::object o, const ApiContext& ctx, std::string& prompt_text) {
  const auto p = member(o, "prompt");
  if (!p) throw bad("'prompt' is required");
  std::string prompt;
  if (p->is_string()) {
    prompt = as_string(*p, "prompt");
  } else {
    dom::array arr;
    if (p->get(arr) || arr.size() != 1 || !arr.at(0).is_string())
      throw bad("'prompt' must be a string (or an array of one string)");
    prompt = as_string(arr.at(0).value(), "prompt");
  }
  if (prompt.empty()) throw bad("'prompt' is empty");
  prompt_text = prompt;
  return ctx.tok.encode(prompt, true);
}

}  // namespace

std::string error_body(const ApiError& e) {
  io::JsonWriter w;
  w.begin_object().key("error").begin_object();
  w.field("message", std::string_view(e.what())).field("type", e.type);
  w.key("param").value(nullptr).key("code").value(nullptr);
  w.end_object().end_object();
  return w.str();
}

const char* finish_reason(Finish f) {
  return f == Finish::length ? "length" : "stop";
}

const char* finish_reason(Finish f, bool made_calls) {
  return made_calls && f == Finish::stop ? "tool_calls" : finish_reason(f);
}

ApiRequest parse_request(Endpoint ep, std::string_view body, const ApiContext& ctx) {
  dom::parser parser;
  dom::element doc;
  if (auto err = parser.parse(body.data(), body.size()).get(doc))
    throw bad(fmt::format("the body is not valid JSON ({})", simdjson::error_message(err)));
  dom::object o;
  if (doc.get(o)) throw bad("the body must be a JSON object");
  refuse_unknown_fields(o, ep);
  ApiRequest r;
  r.endpoint = ep;
  GenRequest& g = r.gen;
  if (auto e = member(o, "model")) {
    const std::string m = as_string(*e, "model");
    if (m != ctx.model)
      throw ApiError(404, "invalid_request_error",
                     fmt::format("the model '{}' does not exist; this server serves '{}'", m, ctx.model));
  }
  if (auto e = member(o, "n"); e && as_integer(*e, "n") != 1) throw bad("'n': only 1 choice is supported");
  if (auto e = member(o, "stream")) r.stream = as_bool(*e, "stream");
  if (auto e = member(o, "stream_options")) {
    dom::object so;
    if (e->get(so)) throw bad("'stream_options' must be an object");
    refuse_unknown_keys(so, "stream_options", {"include_usage", "include_obfuscation"});
    if (auto u = member(so, "include_usage")) r.include_usage = as_bool(*u, "stream_options.include_usage");
    // OpenAI pads streamed chunks with a random `obfuscation` field unless this is false; this
    // server sends no padding, which is what false asks for. true would ask for padding it does
    // not add, so it is refused rather than ignored.
    if (auto ob = member(so, "include_obfuscation"); ob && as_bool(*ob, "stream_options.include_obfuscation"))
      throw bad(
          "'stream_options.include_obfuscation': true is not supported by this server (it adds no "
          "obfuscation padding; send false or leave it out)");
  }
  if (auto e = member(o, "return_token_ids")) r.token_ids = as_bool(*e, "return_token_ids");
  if (auto e = member(o, "ignore_eos")) g.ignore_eos = as_bool(*e, "ignore_eos");
  // Sampling: OpenAI's ranges, then the sampler's own check.
  if (auto e = member(o, "temperature")) {
    g.sampling.temperature = as_number(*e, "temperature");
    if (!(g.sampling.temperature >= 0 && g.sampling.temperature <= 2))
      throw bad("'temperature' must be in [0, 2]");
  }
  if (auto e = member(o, "top_p")) {
    g.sampling.top_p = as_number(*e, "top_p");
    if (!(g.sampling.top_p > 0 && g.sampling.top_p <= 1)) throw bad("'top_p' must be in (0, 1]");
  }
  if (auto e = member(o, "min_p")) {
    g.sampling.min_p = as_number(*e, "min_p");
    if (!(g.sampling.min_p >= 0 && g.sampling.min_p < 1)) throw bad("'min_p' must be in [0, 1)");
  }
  if (auto e = member(o, "top_k")) {
    const int64_t k = as_integer(*e, "top_k");
    if (k < 0 || k > (1 << 30)) throw bad("'top_k' must be >= 0");
    g.sampling.top_k = int(k);
  }
  if (auto e = member(o, "seed")) {
    int64_t s = 0;
    uint64_t u = 0;
    if (e->get(s) == simdjson::SUCCESS)
      g.sampling.seed = uint64_t(s);
    else if (e->get(u) == simdjson::SUCCESS)
      g.sampling.seed = u;
    else
      throw bad("'seed' must be an integer");
  }
  parse_sampling_fields(o, ep, r);
  try {
    stages::validate(g.sampling);
  } catch (const io::Error& err) {
    throw bad(err.what());
  }
  if (auto e = member(o, "stop")) {
    if (e->is_string()) {
      g.stop.push_back(as_string(*e, "stop"));
    } else {
      dom::array arr;
      if (e->get(arr)) throw bad("'stop' must be a string or an array of strings");
      for (dom::element s : arr) g.stop.push_back(as_string(s, "stop"));
      if (g.stop.size() > 4) throw bad("'stop': at most 4 strings");
    }
    for (const std::string& s : g.stop)
      if (s.empty()) throw bad("'stop': an empty string");
  }

  std::string prompt_text;
  g.prompt = ep == Endpoint::chat ? chat_prompt(o, ctx, g) : completion_prompt(o, ctx, prompt_text);
  if (auto e = member(o, "echo"); e && as_bool(*e, "echo")) r.echo = prompt_text;
  if (g.prompt.size() >= ctx.capacity)
    throw bad(fmt::format("the prompt has {} tokens; this server's context holds {} (--context)",
                          g.prompt.size(), ctx.capacity));
  std::optional<dom::element> mt = member(o, "max_tokens");
  if (!mt) mt = member(o, "max_completion_tokens");
  // --max-reply caps every request (a larger max_tokens is clamped to it; finish_reason "length"
  // tells the client) and is a chat request's default; completions default to OpenAI's 16.
  const int64_t cap = std::min<int64_t>(ctx.max_reply, int64_t(ctx.capacity));
  if (mt) {
    const int64_t n = as_integer(*mt, "max_tokens");
    if (n < 1) throw bad("'max_tokens' must be at least 1");
    g.max_tokens = int(std::min<int64_t>(n, cap));
  } else {
    g.max_tokens = int(ep == Endpoint::chat ? cap : std::min<int64_t>(16, cap));
  }
  return r;
}

ResponseBuilder::ResponseBuilder(const ApiRequest& r, std::string model, std::string id, int64_t created)
    : req_(r), model_(std::move(model)), id_(std::move(id)), created_(created) {}

void ResponseBuilder::envelope(io::JsonWriter& w, const char* object) const {
  w.begin_object().field("id", id_).field("object", object).field("created", created_).field("model", model_);
}

std::string ResponseBuilder::chunk(const Delta* d, const char* finish, bool role) const {
  const bool chat = req_.endpoint == Endpoint::chat;
  io::JsonWriter w;
  envelope(w, chat ? "chat.completion.chunk" : "text_completion");
  w.key("choices").begin_array().begin_object().field("index", 0);
  if (chat) {
    w.key("delta").begin_object();
    if (role) w.field("role", "assistant");
    if (d && !d->reasoning.empty()) w.field("reasoning_content", d->reasoning);
    const bool calls = d && !d->tool_calls.empty();
    if (d && (!d->text.empty() || (d->reasoning.empty() && !role && !calls))) w.field("content", d->text);
    if (calls) {
      w.key("tool_calls").begin_array();
      for (size_t i = 0; i < d->tool_calls.size(); ++i) {
        const size_t index = streamed_calls_ + i;
        w.begin_object().field("index", int64_t(index)).field("id", call_id(index)).field("type", "function");
        w.key("function")
            .begin_object()
            .field("name", d->tool_calls[i].name)
            .field("arguments", d->tool_calls[i].arguments)
            .end_object();
        w.end_object();
      }
      w.end_array();
    }
    w.end_object();
  } else {
    w.field("text", (sent_echo_ ? std::string() : req_.echo) + (d ? d->text : std::string()));
  }
  if (req_.token_ids && d) w.field("token_ids", d->ids);
  if (req_.gen.logprobs >= 0) {
    w.key("logprobs");
    if (d && !d->logprobs.empty())
      write_logprobs(w, req_.endpoint, d->logprobs, logprob_offset_);
    else
      w.value(nullptr);
  }
  w.key("finish_reason");
  if (finish)
    w.value(finish);
  else
    w.value(nullptr);
  w.end_object().end_array();
  if (req_.include_usage) w.key("usage").value(nullptr);  // OpenAI: null on every chunk but the last
  w.end_object();
  return "data: " + w.str() + "\n\n";
}

std::string ResponseBuilder::call_id(size_t index) const {
  return fmt::format("call_{}_{}", id_, index);
}

std::string ResponseBuilder::event(const Delta& d) {
  if (d.text.empty() && d.reasoning.empty() && d.tool_calls.empty() && !(req_.token_ids && !d.ids.empty()) &&
      d.logprobs.empty() && (sent_echo_ || req_.echo.empty()))
    return {};
  const bool role = req_.endpoint == Endpoint::chat && !sent_role_;
  std::string ev = chunk(&d, nullptr, role);
  sent_role_ = true;
  sent_echo_ = true;
  streamed_calls_ += d.tool_calls.size();
  calls_.insert(calls_.end(), d.tool_calls.begin(), d.tool_calls.end());
  return ev;
}

void ResponseBuilder::usage(io::JsonWriter& w, const Outcome& o) const {
  w.key("usage")
      .begin_object()
      .field("prompt_tokens", o.prompt_tokens)
      .field("completion_tokens", o.completion_tokens)
      .field("total_tokens", o.prompt_tokens + o.completion_tokens)
      .key("prompt_tokens_details")
      .begin_object()
      .field("cached_tokens", o.cached_tokens)
      .end_object()
      .end_object();
}

std::string ResponseBuilder::final_events(const Outcome& o) {
  std::string out;
  const bool role = req_.endpoint == Endpoint::chat && !sent_role_;
  const Delta empty;
  out += chunk(req_.endpoint == Endpoint::chat ? &empty : nullptr, finish_reason(o.finish, !calls_.empty()),
               role);
  if (req_.include_usage) {
    io::JsonWriter w;
    envelope(w, req_.endpoint == Endpoint::chat ? "chat.completion.chunk" : "text_completion");
    w.key("choices").begin_array().end_array();
    usage(w, o);
    w.end_object();
    out += "data: " + w.str() + "\n\n";
  }
  out += "data: [DONE]\n\n";
  return out;
}

void ResponseBuilder::add(const Delta& d) {
  text_ += d.text;
  reasoning_ += d.reasoning;
  ids_.insert(ids_.end(), d.ids.begin(), d.ids.end());
  logprobs_.insert(logprobs_.end(), d.logprobs.begin(), d.logprobs.end());
  calls_.insert(calls_.end(), d.tool_calls.begin(), d.tool_calls.end());
}

std::string ResponseBuilder::body(const Outcome& o) const {
  const bool chat = req_.endpoint == Endpoint::chat;
  io::JsonWriter w;
  envelope(w, chat ? "chat.completion" : "text_completion");
  w.key("choices").begin_array().begin_object().field("index", 0);
  if (chat) {
    w.key("message").begin_object().field("role", "assistant");
    // OpenAI's shape: content null when the reply is only calls.
    if (text_.empty() && !calls_.empty())
      w.key("content").value(nullptr);
    else
      w.field("content", text_);
    if (req_.gen.thinking) w.field("reasoning_content", reasoning_);
    if (!calls_.empty()) {
      w.key("tool_calls").begin_array();
      for (size_t i = 0; i < calls_.size(); ++i) {
        w.begin_object().field("id", call_id(i)).field("type", "function");
        w.key("function")
            .begin_object()
            .field("name", calls_[i].name)
            .field("arguments", calls_[i].arguments);
        w.end_object().end_object();
      }
      w.end_array();
    }
    w.end_object();
  } else {
    w.field("text", req_.echo + text_);
  }
  if (req_.token_ids) w.field("token_ids", ids_);
  w.key("logprobs");
  if (req_.gen.logprobs >= 0) {
    size_t offset = 0;
    write_logprobs(w, req_.endpoint, logprobs_, offset);
  } else {
    w.value(nullptr);
  }
  w.field("finish_reason", finish_reason(o.finish, !calls_.empty()));
  w.end_object().end_array();
  usage(w, o);
  w.end_object();
  return w.str();
}

namespace {
void model_object(io::JsonWriter& w, const std::string& model, int64_t created) {
  w.begin_object()
      .field("id", model)
      .field("object", "model")
      .field("created", created)
      .field("owned_by", "k3flow")
      .end_object();
}
}  // namespace

std::string models_body(const std::string& model, int64_t created) {
  io::JsonWriter w;
  w.begin_object().field("object", "list").key("data").begin_array();
  model_object(w, model, created);
  w.end_array().end_object();
  return w.str();
}

std::string model_body(const std::string& model, int64_t created) {
  io::JsonWriter w;
  model_object(w, model, created);
  return w.str();
}

}  // namespace k3::pipeline::serve
