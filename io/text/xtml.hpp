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
#include <vector>

namespace k3::io::text {

inline constexpr std::string_view kOpen = "<|open|>";
inline constexpr std::string_view kSep = "<|sep|>";
inline constexpr std::string_view kClose = "<|close|>";
inline constexpr std::string_view kEndOfMsg = "<|end_of_msg|>";
// The released checkpoint ends its turns with [EOS] (163585) although its config.json names
// <|end_of_msg|> (163586); either ends a turn.
inline constexpr std::string_view kEos = "[EOS]";

struct ChatMessage {
  enum class Role { system, user, assistant };
  Role role = Role::user;
  std::string content;
  // Assistant only: the think channel. Empty and absent render the same (an empty channel).
  std::optional<std::string> reasoning;

  bool operator==(const ChatMessage&) const = default;
};

std::string_view role_name(ChatMessage::Role);                  // "system" / "user" / "assistant"
std::optional<ChatMessage::Role> parse_role(std::string_view);  // the inverse; nullopt otherwise

struct ChatOptions {
  bool thinking = true;        // off: no thinking-effort message, no think channels at all
  std::string effort = "max";  // low / high / max
};

// Effort must be low, high or max (the prompt text also names `medium`, but the checkpoint's own
// encoder refuses it); otherwise a usage error naming --think-effort. Checked even with thinking
// off, so a bad flag value is never silently ignored.
void validate(const ChatOptions&);

// Conversation rules: an optional system message first and only first; then user and assistant
// alternating, starting with user; reasoning only on assistant messages. With a generation prompt
// (which opens an assistant message) the conversation must end with a user message.
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

// Incremental rendering for a model state that already holds the conversation so far. With
// prefix = render_prefix(system), turn(u) = render_turn(u), completion(a) = render_completion(a):
//   render([s, u1, a1, u2], true) == prefix(s) + turn(u1) + completion(a1) + turn(u2)
// segment for segment. The model's state after a reply holds what it generated, which matches
// completion(a) only as far as the generation did: it may end with [EOS] instead of
// <|end_of_msg|>, and its ids for the reasoning / reply need not be the ones re-encoding the text
// gives. A chat that carries the state across turns therefore continues from the generated ids,
// not from a re-render (docs/chat.md).
//
// What precedes the first user message: the thinking-effort message (thinking on) and the system
// message if there is one.
std::vector<Segment> render_prefix(const std::optional<std::string>& system, const ChatOptions&);
// The next user message and the generation prompt. Usage error unless `user` is a user message.
std::vector<Segment> render_turn(const ChatMessage& user, const ChatOptions&);
// What the model generates after the generation prompt for `assistant`, ending with <|end_of_msg|>.
std::vector<Segment> render_completion(const ChatMessage& assistant, const ChatOptions&);

std::string join(std::span<const Segment>);

enum class EndToken { none, end_of_msg, eos };

// Newly certain text from a ReplyParser step.
struct ReplyText {
  std::string reasoning;
  std::string reply;
  bool empty() const { return reasoning.empty() && reply.empty(); }
};

// Streaming parser of the assistant's generated text (special tokens decoded to their own text),
// starting right after the generation prompt: inside the think channel, or with thinking off
// inside the response channel. Expected input:
//   [REASONING <|close|>think<|sep|><|open|>response<|sep|>] REPLY
//   <|close|>response<|sep|><|close|>message<|sep|> then <|end_of_msg|> or [EOS]
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
  // Malformed: the text from the offending point on (later feeds appended), for display or logs.
  const std::string& unparsed() const { return unparsed_; }
  // The assistant message as the history stores it: reasoning present iff thinking.
  ChatMessage message() const;

 private:
  void run(ReplyText& out);
  void fail(std::string reason, size_t at);

  bool thinking_;
  bool finished_ = false;
  State state_;
  State settled_from_;  // the parsing state when finish() or a failure ended parsing
  std::string cut_;     // at finish(): the held beginning of the marker that was being written
  EndToken end_ = EndToken::none;
  std::string pending_;  // fed but not yet emitted
  std::string reasoning_, reply_, error_, unparsed_;
};

std::string_view state_name(ReplyParser::State);

}  // namespace k3::io::text
