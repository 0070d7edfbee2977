#include "io/text/xtml.hpp"

#include <fmt/format.h>
#include <simdjson.h>

#include <array>
#include <variant>

#include "io/error.hpp"
#include "io/json_text.hpp"
#include "io/text/xtml_tools.hpp"

namespace k3::io::text {

namespace {

using Role = ChatMessage::Role;

// The closing of the think channel and opening of the response channel, and the closing of the
// response channel and of the message: the two sequences the parser looks for, as decoded text.
const std::string kThinkToResponse = fmt::format("{}think{}{}response{}", kClose, kSep, kOpen, kSep);
const std::string kResponseClosure = fmt::format("{}response{}{}message{}", kClose, kSep, kClose, kSep);

// After the response channel: the opening of the tools block, and what ends the block.
const std::string kResponseToTools = fmt::format("{}response{}{}tools{}", kClose, kSep, kOpen, kSep);
const std::string kToolsClosure = fmt::format("{}tools{}{}message{}", kClose, kSep, kClose, kSep);
const std::string kCallClose = fmt::format("{}call{}", kClose, kSep);

static_assert(kCallOpen.starts_with(kOpen) && kCallOpen.substr(kOpen.size()) == "call",
              "kCallOpen is kOpen followed by \"call\"");
constexpr std::array<std::string_view, 5> kControls = {kOpen, kSep, kClose, kEndOfMsg, kEos};

// The body of the system message that announces the thinking effort. One segment, never split
// around the value: the reference encodes it as one piece and BPE merges run across "=max".
std::string effort_text(std::string_view effort) {
  return fmt::format(
      "`thinking_effort` guides on how much to think in your thinking channel (not including the "
      "response channel), supported values include `low`, `medium`, `high`, and `max`.\n"
      "Now the system is invoked with `thinking_effort={}`.",
      effort);
}

using Attrs = std::vector<std::pair<std::string_view, std::string>>;

class Builder {
 public:
  void control(std::string_view t) { push(t, true); }
  void text(std::string_view t) { push(t, false); }
  // <|open|>tag attrs<|sep|>: the tag and its attributes are separate ordinary segments, as the
  // reference renders them.
  void open(std::string_view tag, std::string_view attrs = {}) {
    control(kOpen);
    text(tag);
    text(attrs);
    control(kSep);
  }
  // <|open|>tag key="value"...<|sep|>, each attribute its own segment with its leading space, as
  // the reference writes attributes.
  void open_attrs(std::string_view tag, const Attrs& attrs) {
    control(kOpen);
    text(tag);
    for (const auto& [k, v] : attrs) text(fmt::format(" {}=\"{}\"", k, escape_attr(v)));
    control(kSep);
  }
  // A message the system writes itself (tool declarations, tool choice): role and type attributes.
  void internal_message(std::string_view type, std::string_view body) {
    open_attrs("message", {{"role", "system"}, {"type", std::string(type)}});
    text(body);
    close("message");
    end_message();
  }
  void close(std::string_view tag) {
    control(kClose);
    text(tag);
    control(kSep);
  }
  void end_message() { control(kEndOfMsg); }

  void message(Role role, std::string_view body, const std::optional<std::string>& name = std::nullopt) {
    Attrs attrs{{"role", std::string(role_name(role))}};
    if (name && !name->empty()) attrs.emplace_back("name", *name);
    open_attrs("message", attrs);
    text(body);
    close("message");
    end_message();
  }
  void tool_result(std::string_view tool, size_t index, std::string_view body) {
    open_attrs("message", {{"role", "tool"}, {"tool", std::string(tool)}, {"index", std::to_string(index)}});
    text(body);
    close("message");
    end_message();
  }
  void generation_prompt(const ChatOptions& o) {
    open("message", role_attr(Role::assistant));
    open(o.thinking ? "think" : "response");
  }
  // Everything of an assistant message after its generation prompt. With thinking off there is
  // no think channel at all, even for reasoning kept from a turn that had one.
  void completion(const ChatMessage& m, const ChatOptions& o) {
    if (o.thinking) {
      text(m.reasoning.value_or(""));
      close("think");
      open("response");
    }
    text(m.content);
    close("response");
    if (!m.tool_calls.empty()) {
      open("tools");
      for (size_t i = 0; i < m.tool_calls.size(); ++i) {
        open_attrs("call", {{"tool", m.tool_calls[i].name}, {"index", std::to_string(i + 1)}});
        arguments(m.tool_calls[i]);
        close("call");
      }
      close("tools");
    }
    close("message");
    end_message();
  }

  // A call's arguments (xtml_tools.hpp: render_arguments).
  void arguments(const ToolCall& call) {
    const RenderedArguments r = render_arguments(call);
    if (r.json_block) {
      open_attrs("json", {{"type", "object"}});
      text(*r.json_block);
      close("json");
      return;
    }
    for (const ArgumentBlock& a : r.blocks) {
      open_attrs("argument", {{"key", a.key}, {"type", a.type}});
      text(a.value);
      close("argument");
    }
  }

  std::vector<Segment> take() { return std::move(out_); }

 private:
  static std::string role_attr(Role r) { return fmt::format(" role=\"{}\"", role_name(r)); }
  void push(std::string_view t, bool control) {
    if (!t.empty()) out_.push_back(Segment{std::string(t), control});
  }
  std::vector<Segment> out_;
};

void tools_message(Builder& b, const ChatOptions& o) {
  if (!o.tools.empty()) b.internal_message("tool-declare", tools_body(o.tools));
}

void tool_choice_message(Builder& b, const ChatOptions& o) {
  if (const std::string body = tool_choice_body(o.tool_choice); !body.empty())
    b.internal_message("tool-choice", body);
}

void effort_message(Builder& b, const ChatOptions& o) {
  if (!o.thinking) return;
  b.open("message", " role=\"system\" type=\"thinking-effort\"");
  b.text(effort_text(o.effort));
  b.close("message");
  b.end_message();
}

void throw_if_bad(std::span<const ChatMessage> msgs, bool add_generation_prompt) {
  if (auto p = check_conversation(msgs, add_generation_prompt))
    throw usage_error(fmt::format("chat: message {}: {}", p->message, p->reason));
}

}  // namespace

std::string_view role_name(Role r) {
  switch (r) {
    case Role::system:
      return "system";
    case Role::user:
      return "user";
    case Role::assistant:
      return "assistant";
    case Role::tool:
      return "tool";
  }
  return "?";
}

std::optional<Role> parse_role(std::string_view s) {
  for (Role r : {Role::system, Role::user, Role::assistant})
    if (s == role_name(r)) return r;
  return std::nullopt;
}

void validate(const ChatOptions& o) {
  if (o.effort != "low" && o.effort != "high" && o.effort != "max")
    throw usage_error(fmt::format("--think-effort must be low, high or max (got '{}')", o.effort));
  if (!o.tools.empty()) validate_tools(o.tools, "tools");
  if (o.tool_choice.kind != ToolChoice::Kind::automatic && o.tools.empty())
    throw usage_error("chat: a tool choice other than auto needs tool declarations");
}

std::optional<ConversationProblem> check_conversation(std::span<const ChatMessage> msgs,
                                                      bool add_generation_prompt) {
  // What may come next: user, then assistant; an assistant message with calls wants tool results,
  // after which another result or the assistant's next message may come.
  Role want = Role::user;
  bool after_tool = false;
  for (size_t i = 0; i < msgs.size(); ++i) {
    const ChatMessage& m = msgs[i];
    if (m.role == Role::system) {
      if (i != 0) return ConversationProblem{i + 1, "a system message may only come first"};
    } else if (m.role == Role::tool && after_tool) {
      // another result of the same calls
    } else if (m.role == Role::assistant && after_tool) {
      want = m.tool_calls.empty() ? Role::user : Role::tool;
      after_tool = false;
    } else if (m.role != want) {
      return ConversationProblem{i + 1,
                                 fmt::format("role is {}, expected {}", role_name(m.role), role_name(want))};
    } else if (m.role == Role::tool) {
      after_tool = true;
      want = Role::assistant;
    } else if (m.role == Role::assistant) {
      want = m.tool_calls.empty() ? Role::user : Role::tool;
    } else {
      want = Role::assistant;
    }
    if (m.reasoning && m.role != Role::assistant)
      return ConversationProblem{
          i + 1, fmt::format("reasoning on a {} message (assistant only)", role_name(m.role))};
    if (!m.tool_calls.empty() && m.role != Role::assistant)
      return ConversationProblem{
          i + 1, fmt::format("tool calls on a {} message (assistant only)", role_name(m.role))};
    for (const ToolCall& c : m.tool_calls)
      if (c.name.empty()) return ConversationProblem{i + 1, "a tool call without a function name"};
  }
  if (add_generation_prompt && want == Role::tool)
    return ConversationProblem{msgs.size() + 1,
                               "the tool calls of the last assistant message have no results"};
  if (add_generation_prompt && want != Role::assistant)
    return ConversationProblem{
        msgs.size() + 1,
        "the generation prompt opens an assistant message, which must follow a user message"};
  return std::nullopt;
}

std::vector<Segment> render(std::span<const ChatMessage> msgs, bool add_generation_prompt,
                            const ChatOptions& o) {
  validate(o);
  throw_if_bad(msgs, add_generation_prompt);
  Builder b;
  // The tool declarations, then the effort announcement precede everything, the conversation's
  // own system message included.
  tools_message(b, o);
  effort_message(b, o);
  size_t tool_index = 0;
  for (const ToolSlot& slot : order_tool_results(msgs)) {
    const ChatMessage& m = msgs[slot.message];
    if (m.role == Role::assistant) {
      tool_index = 0;
      b.generation_prompt(o);
      b.completion(m, o);
    } else if (m.role == Role::tool) {
      b.tool_result(slot.tool, ++tool_index, m.content);
    } else {
      b.message(m.role, m.content, m.name);
    }
  }
  if (add_generation_prompt) {
    tool_choice_message(b, o);
    b.generation_prompt(o);
  }
  return b.take();
}

std::vector<Segment> forced_reply(const ChatOptions& o) {
  using K = ToolChoice::Kind;
  if (o.tool_choice.kind != K::named && o.tool_choice.kind != K::required) return {};
  Builder b;
  if (o.thinking) {
    b.close("think");
    b.open("response");
  }
  b.close("response");
  b.open("tools");
  if (o.tool_choice.kind == K::named) {
    b.open_attrs("call", {{"tool", o.tool_choice.name}, {"index", "1"}});
  } else {
    // The call is opened up to its tool name, which the model writes (then `" index="1"<|sep|>`).
    b.control(kOpen);
    b.text("call");
    b.text(" tool=\"");
  }
  return b.take();
}

std::vector<Segment> render_prefix(const std::optional<std::string>& system, const ChatOptions& o) {
  validate(o);
  Builder b;
  tools_message(b, o);
  effort_message(b, o);
  if (system) b.message(Role::system, *system);
  return b.take();
}

std::vector<Segment> render_turn(const ChatMessage& user, const ChatOptions& o) {
  validate(o);
  throw_if_bad(std::span(&user, 1), true);
  Builder b;
  b.message(Role::user, user.content);
  b.generation_prompt(o);
  return b.take();
}

std::vector<Segment> render_completion(const ChatMessage& assistant, const ChatOptions& o) {
  validate(o);
  if (assistant.role != Role::assistant)
    throw usage_error(
        fmt::format("chat: a completion is an assistant message, not {}", role_name(assistant.role)));
  Builder b;
  b.completion(assistant, o);
  return b.take();
}

std::vector<Segment> render_tool_result(const ChatMessage& tool, size_t index) {
  if (tool.role != Role::tool || !tool.name || tool.name->empty())
    throw usage_error("chat: a tool result needs the tool role and the tool's name");
  Builder b;
  b.tool_result(*tool.name, index, tool.content);
  return b.take();
}

std::vector<Segment> render_generation_prompt(const ChatOptions& o) {
  validate(o);
  Builder b;
  b.generation_prompt(o);
  return b.take();
}

std::string join(std::span<const Segment> segs) {
  std::string s;
  for (const Segment& g : segs) s += g.text;
  return s;
}

// ---- parsing ------------------------------------------------------------------------------------

namespace {

bool is_proper_prefix(std::string_view s, std::string_view of) {
  return s.size() < of.size() && of.substr(0, s.size()) == s;
}

}  // namespace

std::string_view state_name(ReplyParser::State s) {
  using S = ReplyParser::State;
  switch (s) {
    case S::reasoning:
      return "reasoning";
    case S::reply:
      return "reply";
    case S::tools:
      return "tools";
    case S::closed:
      return "closed";
    case S::done:
      return "done";
    case S::truncated:
      return "truncated";
    case S::malformed:
      return "malformed";
  }
  return "?";
}

ReplyParser::ReplyParser(bool thinking)
    : thinking_(thinking), state_(thinking ? State::reasoning : State::reply), settled_from_(state_) {}

ChatMessage ReplyParser::message() const {
  ChatMessage m{Role::assistant, reply_, std::nullopt};
  if (thinking_) m.reasoning = reasoning_;
  m.tool_calls = calls_;
  return m;
}

void ReplyParser::fail(std::string reason, size_t at) {
  settled_from_ = state_;
  state_ = State::malformed;
  error_ = std::move(reason);
  unparsed_ = pending_.substr(at);
  pending_.clear();
}

ReplyText ReplyParser::feed(std::string_view chunk) {
  ReplyText out;
  if (finished_) return out;
  if (state_ == State::malformed) {
    unparsed_ += chunk;
    return out;
  }
  pending_ += chunk;
  run(out);
  return out;
}

ReplyText ReplyParser::finish() {
  ReplyText out;
  if (finished_) return out;
  finished_ = true;
  if (state_ == State::malformed) return out;
  settled_from_ = state_;
  switch (state_) {
    case State::reasoning:
    case State::reply: {
      const bool in_think = state_ == State::reasoning;
      if (is_proper_prefix(pending_, in_think ? kThinkToResponse : kResponseClosure) ||
          (!in_think && is_proper_prefix(pending_, kResponseToTools))) {
        cut_ = pending_;
      } else {
        // Held for a control token that never completed: text after all.
        (in_think ? out.reasoning : out.reply) = pending_;
        (in_think ? reasoning_ : reply_) += pending_;
      }
      state_ = State::truncated;
      break;
    }
    case State::closed:
      // The closing sequence is complete; only the end token is missing, maybe cut.
      cut_ = pending_;
      state_ = State::done;
      break;
    case State::tools:
      // A call without its closing is dropped: half a call is worse than none.
      if (is_proper_prefix(pending_, kToolsClosure)) cut_ = pending_;
      state_ = State::truncated;
      break;
    default:
      break;
  }
  pending_.clear();
  return out;
}

std::vector<Segment> ReplyParser::closing() const {
  const State from =
      state_ == State::truncated || state_ == State::malformed || (state_ == State::done && finished_)
          ? settled_from_
          : state_;
  Builder b;
  if (from == State::reasoning) {
    b.close("think");
    b.open("response");
  }
  if (from == State::reasoning || from == State::reply) {
    b.close("response");
    // The model was opening the tools block: it is opened and closed empty.
    if (from == State::reply && !cut_.empty() && !kResponseClosure.starts_with(cut_)) {
      b.open("tools");
      b.close("tools");
    }
    b.close("message");
  }
  if (from == State::tools) {
    b.close("tools");
    b.close("message");
  }
  if (from != State::done) b.end_message();
  std::vector<Segment> segs = b.take();
  // Drop what was already written of the first marker; a control token cut in two is plain text
  // from then on.
  size_t skip = cut_.size();
  if (from == State::closed && !cut_.empty() && kEos.starts_with(cut_))
    segs = {Segment{std::string(kEos), true}};  // the model was writing [EOS]
  std::vector<Segment> out;
  for (Segment& s : segs) {
    if (skip >= s.text.size()) {
      skip -= s.text.size();
      continue;
    }
    if (skip > 0) {
      out.push_back(Segment{s.text.substr(skip), false});
      skip = 0;
      continue;
    }
    out.push_back(std::move(s));
  }
  return out;
}

bool ReplyParser::run_tools(ReplyText& out) {
  const std::string_view buf = pending_;
  if (buf.empty()) return false;
  if (buf.starts_with(kToolsClosure)) {
    pending_.erase(0, kToolsClosure.size());
    state_ = State::closed;
    return true;
  }
  if (is_proper_prefix(buf, kToolsClosure) || is_proper_prefix(buf, kCallOpen)) return false;
  if (!buf.starts_with(kCallOpen)) {
    fail("expected a tool call or the end of the tools block", 0);
    return false;
  }
  const size_t end = buf.find(kCallClose);
  if (end == std::string_view::npos) {
    for (std::string_view c : {kEndOfMsg, kEos})
      if (buf.find(c) != std::string_view::npos) {
        fail(fmt::format("{} inside a tool call", c), 0);
        return false;
      }
    return false;
  }
  auto call = parse_call(buf.substr(0, end));
  if (auto* why = std::get_if<std::string>(&call)) {
    fail(*why, 0);
    return false;
  }
  calls_.push_back(std::get<ToolCall>(call));
  out.calls.push_back(std::get<ToolCall>(std::move(call)));
  pending_.erase(0, end + kCallClose.size());
  return true;
}

void ReplyParser::run(ReplyText& out) {
  for (;;) {
    if (state_ == State::tools) {
      if (!run_tools(out)) return;
      continue;
    }
    if (state_ == State::reasoning || state_ == State::reply) {
      const bool in_think = state_ == State::reasoning;
      // The markers that end the channel, and the state each leads to.
      const std::string_view marker = in_think ? kThinkToResponse : kResponseClosure;
      const std::string_view tools_marker =
          in_think ? std::string_view() : std::string_view(kResponseToTools);
      std::string& channel = in_think ? out.reasoning : out.reply;
      std::string& total = in_think ? reasoning_ : reply_;
      const std::string_view buf = pending_;
      size_t i = 0;
      std::string_view found;
      bool hold = false;
      for (; i < buf.size(); ++i) {
        if (buf[i] != '<' && buf[i] != '[') continue;
        const std::string_view rest = buf.substr(i);
        if (rest.starts_with(marker)) {
          found = marker;
          break;
        }
        if (!tools_marker.empty() && rest.starts_with(tools_marker)) {
          found = tools_marker;
          break;
        }
        if (is_proper_prefix(rest, marker) ||
            (!tools_marker.empty() && is_proper_prefix(rest, tools_marker))) {
          hold = true;
          break;
        }
        for (std::string_view c : kControls) {
          if (rest.starts_with(c)) {
            channel.append(buf.substr(0, i));
            total.append(buf.substr(0, i));
            const bool end = c == kEndOfMsg || c == kEos;
            const char* where = in_think ? "think" : "response";
            fail(end ? fmt::format("{} before the {} channel was closed", c, where)
                     : fmt::format("unexpected {} in the {} channel", c, where),
                 i);
            return;
          }
          if (is_proper_prefix(rest, c)) hold = true;
        }
        if (hold) break;
      }
      channel.append(buf.substr(0, i));
      total.append(buf.substr(0, i));
      if (found.empty()) {
        pending_.erase(0, i);
        return;
      }
      const size_t n = found.size();
      state_ = in_think ? State::reply : found == marker ? State::closed : State::tools;
      pending_.erase(0, i + n);
      continue;
    }
    if (state_ == State::closed) {
      if (pending_.empty()) return;
      for (auto [text, kind] : {std::pair{kEndOfMsg, EndToken::end_of_msg}, std::pair{kEos, EndToken::eos}}) {
        if (std::string_view(pending_).starts_with(text)) {
          end_ = kind;
          pending_.erase(0, text.size());
          state_ = State::done;
          break;
        }
        if (is_proper_prefix(pending_, text)) return;
      }
      if (state_ == State::done) continue;
      fail("expected <|end_of_msg|> or [EOS] after the closing sequence", 0);
      return;
    }
    if (state_ == State::done && !pending_.empty()) fail("text after the end token", 0);
    return;
  }
}

}  // namespace k3::io::text
