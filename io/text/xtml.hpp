// Kimi K3's chat format, XTML: rendering a conversation into segments for the tokenizer, and a
// streaming parser of what the model generates after the generation prompt. docs/chat.md states
// the format this file implements.
//
// Structure is carried by four control tokens -- <|open|>, <|sep|>, <|close|>, <|end_of_msg|> --
// around tag names, attributes and content that are ordinary text. Nothing here needs a tokenizer:
// rendering yields text segments flagged control or not, and parsing works on decoded text.
#pragma once
#include <cstddef>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace k3::io::text {

inline constexpr std::string_view kOpen = "<|open|>";
inline constexpr std::string_view kSep = "<|sep|>";
inline constexpr std::string_view kClose = "<|close|>";
inline constexpr std::string_view kEndOfMsg = "<|end_of_msg|>";
// The released checkpoint ends its turns with [EOS] (163585) although its config.json names
// <|end_of_msg|> (163586); either ends a turn.
inline constexpr std::string_view kEos = "[EOS]";
// What opens a tool call in an assistant's tools segment: kOpen followed by "call".
inline constexpr std::string_view kCallOpen = "<|open|>call";

// One function call of an assistant message, as OpenAI's API carries it.
struct ToolCall {
  std::string id;         // the client's id (rendering ignores it; tool results name it)
  std::string name;       // the function
  std::string arguments;  // a JSON object as text; empty for none
  bool operator==(const ToolCall&) const = default;
};

struct ChatMessage {
  enum class Role { system, user, assistant, tool };
  ChatMessage() = default;
  ChatMessage(Role r, std::string c, std::optional<std::string> reason = std::nullopt)
      : role(r), content(std::move(c)), reasoning(std::move(reason)) {}

  Role role = Role::user;
  std::string content;
  // Assistant only: the think channel. Empty and absent render the same (an empty channel).
  std::optional<std::string> reasoning;
  // Assistant only: the calls it made, rendered after its response channel.
  std::vector<ToolCall> tool_calls;
  // Tool only: the call this result answers (matched against the calls of the assistant message
  // before it); `name` is the fallback when no call has that id. User and system: the speaker's
  // name, rendered as a name attribute.
  std::string tool_call_id;
  std::optional<std::string> name;

  bool operator==(const ChatMessage&) const = default;
};

// "system" / "user" / "assistant" / "tool"
std::string_view role_name(ChatMessage::Role);
// The inverse for system / user / assistant (the roles a history file holds); nullopt otherwise.
std::optional<ChatMessage::Role> parse_role(std::string_view);

// Which calls the reply may make (OpenAI's tool_choice). The format knows `required` and `none`
// as a system message after the conversation; `named` is told `required`. `required` and `named`
// are also forced: the generation prompt goes on to open a call (see forced_reply()).
struct ToolChoice {
  enum class Kind { automatic, none, required, named };
  Kind kind = Kind::automatic;
  std::string name;  // named only
  bool operator==(const ToolChoice&) const = default;
};

struct ChatOptions {
  ChatOptions() = default;
  ChatOptions(bool think, std::string eff) : thinking(think), effort(std::move(eff)) {}

  bool thinking = true;        // off: no thinking-effort message, no think channels at all
  std::string effort = "max";  // low / high / max
  // The tool declarations: a JSON array of OpenAI tool objects, as text; empty for none.
  // Rendered first, keys sorted, compact.
  std::string tools;
  ToolChoice tool_choice;
};

// Usage error naming `what` and the tool's index unless `tools` is a JSON array of objects each with
// a function name ({"type":"function","function":{"name":...}}) and no key beyond type and function,
// and name, description, parameters and strict (a boolean) in the function.
void validate_tools(std::string_view tools, std::string_view what);

// Effort must be low, high or max (the prompt text also names `medium`, but the checkpoint's own
// encoder refuses it); otherwise a usage error naming --think-effort. Checked even with thinking
// off, so a bad flag value is never silently ignored.
void validate(const ChatOptions&);

// Conversation rules: an optional system message first and only first; then user and assistant
// alternating, starting with user; reasoning and tool calls only on assistant messages. An
// assistant message with tool calls is followed by tool messages (one or more), and those by an
// assistant message or the generation prompt. With a generation prompt (which opens an assistant
// message) the conversation must end with a user or a tool message.
struct ConversationProblem {
  size_t message;  // 1-based
  std::string reason;
};
std::optional<ConversationProblem> check_conversation(std::span<const ChatMessage>,
                                                      bool add_generation_prompt);

// One piece of rendered text. control: a special token's text, to be encoded with specials
// allowed; otherwise ordinary text, encoded with specials refused (content is never parsed for
// control tokens). Boundaries matter: rank BPE never merges across them. Empty pieces are omitted.
struct Segment {
  std::string text;
  bool control = false;

  bool operator==(const Segment&) const = default;
};

// The whole conversation, then the generation prompt if asked. Usage errors for bad options or a
// conversation breaking the rules ("chat: message N: ...").
std::vector<Segment> render(std::span<const ChatMessage>, bool add_generation_prompt, const ChatOptions&);

// With a required or named tool choice: the text the prompt holds after the generation prompt,
// which the reply parser must be fed first (as if generated) -- the think channel closed empty
// (thinking on), an empty response channel, the opening of the tools block and of a call: whole
// for a named function, up to `tool="` for required (the model names the function). Empty for
// auto and none.
std::vector<Segment> forced_reply(const ChatOptions&);

// Incremental rendering for a model state that already holds the conversation so far. With
// prefix = render_prefix(system), turn(u) = render_turn(u), completion(a) = render_completion(a):
//   render([s, u1, a1, u2], true) == prefix(s) + turn(u1) + completion(a1) + turn(u2)
// segment for segment. The model's state after a reply holds what it generated, which matches
// completion(a) only as far as the generation did: it may end with [EOS] instead of
// <|end_of_msg|>, and its ids for the reasoning / reply need not be the ones re-encoding the text
// gives. A chat that carries the state across turns therefore continues from the generated ids,
// not from a re-render (docs/chat.md).
//
// What precedes the first user message: the tool declarations (if any), the thinking-effort
// message (thinking on) and the system message if there is one.
std::vector<Segment> render_prefix(const std::optional<std::string>& system, const ChatOptions&);
// The next user message and the generation prompt. Usage error unless `user` is a user message.
std::vector<Segment> render_turn(const ChatMessage& user, const ChatOptions&);
// What the model generates after the generation prompt for `assistant`, ending with <|end_of_msg|>.
std::vector<Segment> render_completion(const ChatMessage& assistant, const ChatOptions&);
// The result of the index-th (1-based) call of the last assistant message, under the tool name
// `tool.name` (usage error without one). After the last result, render_generation_prompt() opens
// the reply to them.
std::vector<Segment> render_tool_result(const ChatMessage& tool, size_t index);
std::vector<Segment> render_generation_prompt(const ChatOptions&);

std::string join(std::span<const Segment>);

enum class EndToken { none, end_of_msg, eos };

// Newly certain text from a ReplyParser step, and the tool calls completed in it (ids empty).
struct ReplyText {
  std::string reasoning;
  std::string reply;
  std::vector<ToolCall> calls;
  bool empty() const { return reasoning.empty() && reply.empty() && calls.empty(); }
};

// Streaming parser of the assistant's generated text (special tokens decoded to their own text),
// starting right after the generation prompt: inside the think channel, or with thinking off
// inside the response channel. Expected input:
//   [REASONING <|close|>think<|sep|><|open|>response<|sep|>] REPLY <|close|>response<|sep|>
//   [<|open|>tools<|sep|> CALL... <|close|>tools<|sep|>] <|close|>message<|sep|>
//   then <|end_of_msg|> or [EOS]
// where a CALL is <|open|>call tool="NAME" index="N"<|sep|> ARGUMENTS <|close|>call<|sep|> and is
// emitted whole once its closing arrives (docs/chat.md).
// Text is passed through byte for byte, never split inside a marker: a tail that could still grow
// into a marker or control token is held until it cannot. A control token anywhere else, an end
// token before the closing sequence, or text after the end token is malformed. Working on text
// lets one parser serve vocabularies with the control tokens as specials and ones (the 256-byte
// test vocabulary) where they are plain text.
class ReplyParser {
 public:
  enum class State {
    reasoning,  // inside the think channel
    reply,      // inside the response channel
    tools,      // inside the tools block, between calls or inside one
    closed,     // after the closing sequence, waiting for the end token
    done,       // end token seen (or, at finish(), the closing sequence without one)
    truncated,  // finish() before the closing sequence: what was emitted is all there is
    malformed,  // see error(); nothing more is emitted
  };

  explicit ReplyParser(bool thinking);

  ReplyText feed(std::string_view chunk);
  // The generation stopped: settles the state (truncated if the turn was not closed) and releases
  // held text -- except a held beginning of the sequence that closes the current channel, which
  // the model was evidently writing and closing() completes. Later feeds are ignored.
  ReplyText finish();

  // After finish(): what to append to the generated text so that it forms a whole assistant
  // message (the rest of a cut marker, the missing closing sequences, <|end_of_msg|>); empty once
  // an end token was seen. For a chat whose model state must end on a message boundary. Feeding
  // the generated text plus these segments to a new parser yields `done` with the same reasoning
  // and reply. Malformed output gets the closings of the channel it broke in (best effort).
  std::vector<Segment> closing() const;

  State state() const { return state_; }
  EndToken end_token() const { return end_; }
  const std::string& error() const { return error_; }  // empty unless malformed
  // Everything emitted so far, per channel.
  const std::string& reasoning() const { return reasoning_; }
  const std::string& reply() const { return reply_; }
  const std::vector<ToolCall>& calls() const { return calls_; }
  // Malformed: the text from the offending point on (later feeds appended), for display or logs.
  const std::string& unparsed() const { return unparsed_; }
  // The assistant message as the history stores it: reasoning present iff thinking.
  ChatMessage message() const;

 private:
  void run(ReplyText& out);
  bool run_tools(ReplyText& out);  // false: wait for more text (or failed)
  void fail(std::string reason, size_t at);

  bool thinking_;
  bool finished_ = false;
  State state_;
  State settled_from_;  // the parsing state when finish() or a failure ended parsing
  std::string cut_;     // at finish(): the held beginning of the marker that was being written
  EndToken end_ = EndToken::none;
  std::string pending_;  // fed but not yet emitted
  std::string reasoning_, reply_, error_, unparsed_;
  std::vector<ToolCall> calls_;
};

std::string_view state_name(ReplyParser::State);

}  // namespace k3::io::text
