// The chat request's conversation and tools, and the list of fields a request may carry.
#include <fmt/format.h>
#include <simdjson.h>

#include <algorithm>
#include <array>

#include "io/error.hpp"
#include "io/text/xtml.hpp"
#include "pipeline/serve/api_json.hpp"

namespace k3::pipeline::serve {

namespace dom = simdjson::dom;
namespace text = io::text;

namespace {

// Implemented, or (user) accepted with no effect on the output by design. logprobs, top_logprobs,
// presence_penalty, frequency_penalty and response_format are the sampler's fields.
constexpr std::array kCommonFields = {"model",
                                      "stream",
                                      "stream_options",
                                      "max_tokens",
                                      "max_completion_tokens",
                                      "temperature",
                                      "top_p",
                                      "top_k",
                                      "min_p",
                                      "seed",
                                      "stop",
                                      "n",
                                      "user",
                                      "return_token_ids",
                                      "ignore_eos",
                                      "logprobs",
                                      "presence_penalty",
                                      "frequency_penalty",
                                      "response_format"};
constexpr std::array kChatFields = {"messages",    "reasoning_effort",    "thinking",    "tools",
                                    "tool_choice", "parallel_tool_calls", "top_logprobs"};
constexpr std::array kCompletionFields = {"prompt", "echo"};

template <size_t N>
bool listed(const std::array<const char*, N>& names, std::string_view key) {
  return std::any_of(names.begin(), names.end(), [&](const char* n) { return key == n; });
}

std::string message_text(dom::element c, size_t i) {
  if (c.is_string()) return std::string(std::string_view(c));
  // [{"type":"text","text":...}, ...]: the text parts joined.
  dom::array parts;
  if (c.get(parts)) throw bad(fmt::format("messages[{}].content must be a string or an array", i));
  std::string out;
  size_t k = 0;
  for (dom::element p : parts) {
    const std::string where = fmt::format("messages[{}].content[{}]", i, k++);
    dom::object po;
    if (p.get(po)) throw bad(where + " must be an object");
    const auto type = member(po, "type");
    if (!type) throw bad(where + ".type is required (\"text\")");
    const std::string ts = as_string(*type, where + ".type");
    // Images, audio, files and refusals have no place in K3's text-only prompt.
    if (ts != "text")
      throw bad(fmt::format("'{}.type' '{}' is not supported by this server (text parts only)", where, ts));
    refuse_unknown_keys(po, where, {"type", "text"});
    const auto t = member(po, "text");
    if (!t) throw bad(where + ".text is required");
    out += as_string(*t, where + ".text");
  }
  return out;
}

std::vector<text::ToolCall> parse_calls(dom::element e, size_t i) {
  dom::array arr;
  if (e.get(arr)) throw bad(fmt::format("messages[{}].tool_calls must be an array", i));
  std::vector<text::ToolCall> calls;
  size_t k = 0;
  for (dom::element c : arr) {
    const std::string where = fmt::format("messages[{}].tool_calls[{}]", i, k++);
    dom::object co, fn;
    if (c.get(co)) throw bad(where + " must be an object");
    refuse_unknown_keys(co, where, {"id", "type", "function"});
    if (auto t = member(co, "type"); t && as_string(*t, where + ".type") != "function")
      throw bad(where + ".type: only \"function\" calls are supported");
    if (co.at_key("function").get(fn)) throw bad(where + ".function must be an object");
    refuse_unknown_keys(fn, where + ".function", {"name", "arguments"});
    text::ToolCall call;
    if (auto id = member(co, "id")) call.id = as_string(*id, where + ".id");
    const auto name = member(fn, "name");
    if (!name) throw bad(where + ".function.name is required");
    call.name = as_string(*name, where + ".function.name");
    if (auto a = member(fn, "arguments")) {
      // OpenAI sends the arguments as a JSON string; an object is taken as its text.
      if (a->is_string())
        call.arguments = as_string(*a, where + ".function.arguments");
      else if (a->is_object())
        call.arguments = simdjson::minify(*a);
      else
        throw bad(where + ".function.arguments must be a JSON string");
    }
    calls.push_back(std::move(call));
  }
  return calls;
}

}  // namespace

void refuse_unknown_fields(dom::object body, Endpoint ep) {
  for (dom::key_value_pair kv : body) {
    if (kv.value.is_null() || listed(kCommonFields, kv.key)) continue;
    if (ep == Endpoint::chat ? listed(kChatFields, kv.key) : listed(kCompletionFields, kv.key)) continue;
    throw bad(fmt::format("'{}' is not supported by this server ({}; docs/serve.md lists the fields)", kv.key,
                          ep == Endpoint::chat ? "/v1/chat/completions" : "/v1/completions"));
  }
}

std::vector<text::ChatMessage> parse_messages(dom::object o) {
  using Role = text::ChatMessage::Role;
  const auto m = member(o, "messages");
  if (!m) throw bad("'messages' is required");
  dom::array arr;
  if (m->get(arr)) throw bad("'messages' must be an array");
  std::vector<text::ChatMessage> msgs;
  size_t i = 0;
  for (dom::element e : arr) {
    dom::object mo;
    if (e.get(mo)) throw bad(fmt::format("messages[{}] must be an object", i));
    const auto role = member(mo, "role");
    if (!role) throw bad(fmt::format("messages[{}].role is required", i));
    const std::string rs = as_string(*role, "role");
    std::optional<Role> r = text::parse_role(rs);
    // OpenAI's developer messages are the system's instructions: K3 has only the system role.
    if (rs == "developer") r = Role::system;
    if (rs == "tool") r = Role::tool;
    if (!r)
      throw bad(fmt::format("messages[{}].role '{}': system, developer, user, assistant or tool", i, rs));
    text::ChatMessage msg{*r, ""};
    for (dom::key_value_pair kv : mo) {
      if (kv.value.is_null()) continue;
      const std::string_view k = kv.key;
      const bool ok = k == "role" || k == "content" || (k == "name" && *r != Role::assistant) ||
                      (*r == Role::assistant && (k == "reasoning_content" || k == "tool_calls")) ||
                      (*r == Role::tool && k == "tool_call_id");
      if (!ok)
        throw bad(fmt::format("messages[{}].{} is not supported on {} {} message", i, k,
                              *r == Role::assistant ? "an" : "a", rs));
    }
    if (auto c = member(mo, "content")) msg.content = message_text(*c, i);
    if (auto rc = member(mo, "reasoning_content")) msg.reasoning = as_string(*rc, "reasoning_content");
    if (auto n = member(mo, "name")) msg.name = as_string(*n, fmt::format("messages[{}].name", i));
    if (auto tc = member(mo, "tool_calls")) msg.tool_calls = parse_calls(*tc, i);
    if (auto id = member(mo, "tool_call_id")) msg.tool_call_id = as_string(*id, "tool_call_id");
    msgs.push_back(std::move(msg));
    ++i;
  }
  if (msgs.empty()) throw bad("'messages' is empty");
  return msgs;
}

void parse_tools(dom::object o, text::ChatOptions& opts, GenRequest& g) {
  using Kind = text::ToolChoice::Kind;
  if (auto t = member(o, "tools")) {
    dom::array arr;
    if (t->get(arr)) throw bad("'tools' must be an array");
    // Each declaration's keys: what the render and the checks read, and `strict` (OpenAI's request
    // that arguments follow `parameters` exactly; accepted, not enforced: docs/serve.md).
    size_t i = 0;
    for (dom::element decl : arr) {
      const std::string where = fmt::format("tools[{}]", i++);
      dom::object to, fn;
      if (decl.get(to)) throw bad(where + " must be an object");
      refuse_unknown_keys(to, where, {"type", "function"});
      if (to.at_key("function").get(fn) == simdjson::SUCCESS) {
        refuse_unknown_keys(fn, where + ".function", {"name", "description", "parameters", "strict"});
        if (auto s = member(fn, "strict")) as_bool(*s, where + ".function.strict");
      }
    }
    if (arr.size() > 0) opts.tools = simdjson::minify(*t);
    try {
      if (!opts.tools.empty()) text::validate_tools(opts.tools, "'tools'");
    } catch (const io::Error& err) {
      throw bad(err.what());
    }
  }
  if (auto c = member(o, "tool_choice")) {
    if (c->is_string()) {
      const std::string s = as_string(*c, "tool_choice");
      if (s == "auto")
        opts.tool_choice.kind = Kind::automatic;
      else if (s == "none")
        opts.tool_choice.kind = Kind::none;
      else if (s == "required")
        opts.tool_choice.kind = Kind::required;
      else
        throw bad(fmt::format("'tool_choice' {}: auto, none, required or {{\"type\":\"function\",...}}", s));
    } else {
      dom::object co, fn;
      std::string_view type, name;
      if (c->get(co) || co.at_key("type").get(type) || type != "function" || co.at_key("function").get(fn) ||
          fn.at_key("name").get(name))
        throw bad("'tool_choice' must be a string or {\"type\":\"function\",\"function\":{\"name\":...}}");
      refuse_unknown_keys(co, "tool_choice", {"type", "function"});
      refuse_unknown_keys(fn, "tool_choice.function", {"name"});
      opts.tool_choice = text::ToolChoice{Kind::named, std::string(name)};
    }
    if (opts.tool_choice.kind != Kind::automatic && opts.tools.empty())
      throw bad("'tool_choice' other than auto needs 'tools'");
    if (opts.tool_choice.kind == Kind::named) {
      bool declared = false;
      dom::parser p;
      for (dom::element t : p.parse(opts.tools).get_array()) {
        std::string_view n;
        if (!t["function"]["name"].get(n) && n == opts.tool_choice.name) declared = true;
      }
      if (!declared)
        throw bad(
            fmt::format("'tool_choice' names '{}', which 'tools' does not declare", opts.tool_choice.name));
    }
  }
  if (auto p = member(o, "parallel_tool_calls"); p && !as_bool(*p, "parallel_tool_calls")) g.max_calls = 1;
}

}  // namespace k3::pipeline::serve
