#include <doctest/doctest.h>

#include <random>
#include <string>
#include <vector>

#include "io/error.hpp"
#include "io/text/xtml.hpp"
#include "tests/xtml_segments.hpp"

using namespace k3::io::text;
using Role = ChatMessage::Role;
using k3::test::C;
using k3::test::close_tag;
using k3::test::open_tag;
using k3::test::T;

namespace {

ChatMessage sys(std::string c) {
  return {Role::system, std::move(c), std::nullopt};
}
ChatMessage usr(std::string c) {
  return {Role::user, std::move(c), std::nullopt};
}
ChatMessage bot(std::string c, std::optional<std::string> r = std::nullopt) {
  return {Role::assistant, std::move(c), std::move(r)};
}

std::string effort_body(const std::string& effort) {
  return "`thinking_effort` guides on how much to think in your thinking channel (not including the "
         "response channel), supported values include `low`, `medium`, `high`, and `max`.\n"
         "Now the system is invoked with `thinking_effort=" +
         effort + "`.";
}

// <|open|>message role="R"<|sep|> as the reference segments it: tag and attributes apart.
std::vector<Segment> open_message(const std::string& role) {
  return {C("<|open|>"), T("message"), T(" role=\"" + role + "\""), C("<|sep|>")};
}

std::vector<Segment> cat(std::initializer_list<std::vector<Segment>> parts) {
  std::vector<Segment> out;
  for (const auto& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}

std::string usage_message(auto&& f) {
  try {
    f();
  } catch (const k3::io::Error& e) {
    CHECK(e.kind() == k3::io::ErrorKind::usage);
    return e.what();
  }
  return "(no error)";
}

const std::vector<ChatMessage> kConversation = {sys("You are terse."), usr("Hi"),
                                                bot("Hello!", "Greet back."), usr("Bye")};

}  // namespace

TEST_CASE("render: system + user + assistant with reasoning + user, thinking on, generation prompt") {
  ChatOptions o;  // thinking, effort max
  const std::vector<Segment> want = cat({
      {C("<|open|>"), T("message"), T(" role=\"system\" type=\"thinking-effort\""), C("<|sep|>"),
       T(effort_body("max")), C("<|close|>"), T("message"), C("<|sep|>"), C("<|end_of_msg|>")},
      open_message("system"),
      {T("You are terse.")},
      close_tag("message"),
      {C("<|end_of_msg|>")},
      open_message("user"),
      {T("Hi")},
      close_tag("message"),
      {C("<|end_of_msg|>")},
      open_message("assistant"),
      open_tag("think"),
      {T("Greet back.")},
      close_tag("think"),
      open_tag("response"),
      {T("Hello!")},
      close_tag("response"),
      close_tag("message"),
      {C("<|end_of_msg|>")},
      open_message("user"),
      {T("Bye")},
      close_tag("message"),
      {C("<|end_of_msg|>")},
      open_message("assistant"),
      open_tag("think"),
  });
  const std::vector<Segment> got = render(kConversation, true, o);
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    CAPTURE(i);
    CHECK(got[i].text == want[i].text);
    CHECK(got[i].control == want[i].control);
  }
  CHECK(join(got) ==
        "<|open|>message role=\"system\" type=\"thinking-effort\"<|sep|>" + effort_body("max") +
            "<|close|>message<|sep|><|end_of_msg|>"
            "<|open|>message role=\"system\"<|sep|>You are terse.<|close|>message<|sep|><|end_of_msg|>"
            "<|open|>message role=\"user\"<|sep|>Hi<|close|>message<|sep|><|end_of_msg|>"
            "<|open|>message role=\"assistant\"<|sep|><|open|>think<|sep|>Greet back.<|close|>think<|sep|>"
            "<|open|>response<|sep|>Hello!<|close|>response<|sep|><|close|>message<|sep|><|end_of_msg|>"
            "<|open|>message role=\"user\"<|sep|>Bye<|close|>message<|sep|><|end_of_msg|>"
            "<|open|>message role=\"assistant\"<|sep|><|open|>think<|sep|>");
}

TEST_CASE("render: thinking off drops the effort message and every think channel") {
  ChatOptions o;
  o.thinking = false;
  const std::vector<Segment> want = cat({
      open_message("system"),
      {T("You are terse.")},
      close_tag("message"),
      {C("<|end_of_msg|>")},
      open_message("user"),
      {T("Hi")},
      close_tag("message"),
      {C("<|end_of_msg|>")},
      open_message("assistant"),
      open_tag("response"),
      {T("Hello!")},
      close_tag("response"),
      close_tag("message"),
      {C("<|end_of_msg|>")},
      open_message("user"),
      {T("Bye")},
      close_tag("message"),
      {C("<|end_of_msg|>")},
      open_message("assistant"),
      open_tag("response"),
  });
  CHECK(render(kConversation, true, o) == want);
  // Without the generation prompt the render stops after the last message.
  CHECK(render(kConversation, false, o) == std::vector<Segment>(want.begin(), want.end() - 4 - 3));
}

TEST_CASE("render: effort text, empty pieces, content never parsed for control tokens") {
  ChatOptions o;
  o.effort = "low";
  const auto segs = render(std::vector<ChatMessage>{usr("<|open|>x[EOS]")}, true, o);
  CHECK(segs[4] == T(effort_body("low")));
  CHECK(segs[4].text.ends_with("`thinking_effort=low`."));
  // The user's text holds control-token text but is one ordinary segment.
  CHECK(segs[13] == T("<|open|>x[EOS]"));

  // An assistant without reasoning and an empty reply: empty channels, no empty segments.
  const auto empty = render(std::vector<ChatMessage>{usr("q"), bot("", std::nullopt)}, false, ChatOptions{});
  for (const Segment& s : empty) CHECK(!s.text.empty());
  CHECK(join(empty).ends_with(
      "<|open|>message role=\"assistant\"<|sep|><|open|>think<|sep|><|close|>think<|sep|>"
      "<|open|>response<|sep|><|close|>response<|sep|><|close|>message<|sep|><|end_of_msg|>"));
  CHECK(render(std::vector<ChatMessage>{usr("q"), bot("", "")}, false, ChatOptions{}) == empty);
}

TEST_CASE("render refuses bad options and conversations, naming the flag or message") {
  ChatOptions o;
  o.effort = "medium";
  CHECK(usage_message([&] { render(std::vector<ChatMessage>{usr("x")}, true, o); }) ==
        "--think-effort must be low, high or max (got 'medium')");
  o.thinking = false;  // still refused: a bad value is never silently ignored
  CHECK(usage_message([&] { validate(o); }).starts_with("--think-effort"));
  for (const char* ok : {"low", "high", "max"}) CHECK_NOTHROW(validate(ChatOptions{true, ok}));

  auto refusal = [](std::vector<ChatMessage> m, bool gen = false) {
    return usage_message([&] { render(m, gen, ChatOptions{}); });
  };
  CHECK(refusal({usr("a"), usr("b")}) == "chat: message 2: role is user, expected assistant");
  CHECK(refusal({bot("a")}) == "chat: message 1: role is assistant, expected user");
  CHECK(refusal({sys("s"), bot("a")}) == "chat: message 2: role is assistant, expected user");
  CHECK(refusal({usr("a"), sys("s")}) == "chat: message 2: a system message may only come first");
  CHECK(refusal({sys("a"), sys("s")}) == "chat: message 2: a system message may only come first");
  CHECK(refusal({{Role::user, "a", "why"}}) ==
        "chat: message 1: reasoning on a user message (assistant only)");
  CHECK(refusal({{Role::system, "a", "why"}}) ==
        "chat: message 1: reasoning on a system message (assistant only)");
  CHECK(refusal({usr("a"), bot("b")}, true) ==
        "chat: message 3: the generation prompt opens an assistant message, which must follow a "
        "user message");
  CHECK(refusal({}, true).starts_with("chat: message 1: the generation prompt"));
  CHECK(refusal({sys("s")}, true).starts_with("chat: message 2: the generation prompt"));
  CHECK_NOTHROW(render(std::vector<ChatMessage>{}, false, ChatOptions{}));
  CHECK_NOTHROW(render(std::vector<ChatMessage>{usr("a"), bot("b")}, false, ChatOptions{}));

  CHECK(usage_message([] { render_turn(bot("a"), ChatOptions{}); }).starts_with("chat: message 1:"));
  CHECK(usage_message([] { render_completion(usr("a"), ChatOptions{}); }).starts_with("chat:"));
}

TEST_CASE("prefix + turns + completions equal the full render, segment for segment") {
  for (bool thinking : {true, false}) {
    for (bool with_system : {true, false}) {
      CAPTURE(thinking);
      CAPTURE(with_system);
      ChatOptions o;
      o.thinking = thinking;
      o.effort = "high";
      std::vector<ChatMessage> conv;
      std::optional<std::string> system;
      if (with_system) {
        system = "Be brief.";
        conv.push_back(sys(*system));
      }
      std::vector<Segment> live = render_prefix(system, o);
      const std::vector<std::pair<std::string, ChatMessage>> turns = {
          {"one?", bot("1", "count")}, {"two?", bot("2", std::nullopt)}, {"", bot("three", "")}};
      for (const auto& [question, answer] : turns) {
        conv.push_back(usr(question));
        const auto turn = render_turn(conv.back(), o);
        live.insert(live.end(), turn.begin(), turn.end());
        CHECK(live == render(conv, true, o));
        conv.push_back(answer);
        const auto completion = render_completion(answer, o);
        live.insert(live.end(), completion.begin(), completion.end());
        CHECK(live == render(conv, false, o));
      }
    }
  }
}

namespace {

struct Parsed {
  std::string reasoning, reply;
  ReplyParser::State state;
  EndToken end;
};

// Feeds `pieces` in order, checking after every step that what came out so far is a prefix of
// what is expected in the end (so nothing was emitted that a later byte would have made a marker).
Parsed parse(const std::vector<std::string>& pieces, bool thinking, const ChatMessage* expect = nullptr) {
  ReplyParser p(thinking);
  std::string r, a;
  for (const std::string& piece : pieces) {
    const ReplyText t = p.feed(piece);
    r += t.reasoning;
    a += t.reply;
    if (expect) {
      REQUIRE(expect->reasoning.value_or("").starts_with(r));
      REQUIRE(expect->content.starts_with(a));
    }
  }
  const ReplyText t = p.finish();
  r += t.reasoning;
  a += t.reply;
  CHECK(r == p.reasoning());
  CHECK(a == p.reply());
  return {r, a, p.state(), p.end_token()};
}

std::vector<std::string> bytes_of(const std::string& s) {
  std::vector<std::string> out;
  for (char c : s) out.emplace_back(1, c);
  return out;
}

}  // namespace

TEST_CASE("the reply parser gives the same split for every chunking of a completion") {
  // Payloads full of marker beginnings that never complete, and multi-byte UTF-8.
  const ChatMessage msg = bot("Answer: a<|b|>c, [EOS-like] and <|end_of_ms; 中文 🙂 <|sep|",
                              "Compare a<b and [E] vs [EOS; also <|sep and <|clo> -- 日本語 🙂 <");
  for (bool thinking : {true, false}) {
    for (EndToken end : {EndToken::end_of_msg, EndToken::eos}) {
      CAPTURE(thinking);
      ChatOptions o;
      o.thinking = thinking;
      std::string text = join(render_completion(msg, o));
      if (end == EndToken::eos) text.replace(text.size() - kEndOfMsg.size(), kEndOfMsg.size(), kEos);
      ChatMessage want = msg;
      if (!thinking) want.reasoning = std::nullopt;

      auto check = [&](const std::vector<std::string>& pieces) {
        const Parsed got = parse(pieces, thinking, &want);
        CHECK(got.reasoning == want.reasoning.value_or(""));
        CHECK(got.reply == want.content);
        CHECK(got.state == ReplyParser::State::done);
        CHECK(got.end == end);
      };
      check({text});
      check(bytes_of(text));
      for (size_t cut = 0; cut <= text.size(); ++cut) check({text.substr(0, cut), text.substr(cut)});
      std::mt19937 g(static_cast<uint32_t>(text.size()));
      for (int trial = 0; trial < 300; ++trial) {
        std::vector<std::string> pieces;
        for (size_t at = 0; at < text.size();) {
          const size_t n = std::uniform_int_distribution<size_t>(0, 12)(g);
          pieces.push_back(text.substr(at, n));
          at += n;
        }
        check(pieces);
      }

      ReplyParser p(thinking);
      p.feed(text);
      CHECK(p.message() == want);
    }
  }
}

TEST_CASE("the reply parser holds back exactly what could still become a marker") {
  ReplyParser p(true);
  CHECK(p.feed("Hello wor").reasoning == "Hello wor");
  ReplyText t = p.feed("ld <|cl");
  CHECK(t.reasoning == "ld ");  // "<|cl" may yet be <|close|>
  t = p.feed("ose|>think<|sep|><|op");
  CHECK(t.empty());
  CHECK(p.state() == ReplyParser::State::reasoning);
  t = p.feed("en|>response<|sep|>Hi [");
  CHECK(p.state() == ReplyParser::State::reply);
  CHECK(t.reasoning.empty());
  CHECK(t.reply == "Hi ");  // "[" may yet be [EOS]
  CHECK(p.feed("x").reply == "[x");
  t = p.feed("<|close|>response<|sep|><|close|>message<|sep|>");
  CHECK(t.empty());
  CHECK(p.state() == ReplyParser::State::closed);
  CHECK(p.feed("[EO").empty());
  CHECK(p.state() == ReplyParser::State::closed);
  p.feed("S]");
  CHECK(p.state() == ReplyParser::State::done);
  CHECK(p.end_token() == EndToken::eos);
  CHECK(p.reasoning() == "Hello world ");
  CHECK(p.reply() == "Hi [x");
  CHECK(p.finish().empty());
  CHECK(p.state() == ReplyParser::State::done);
}

TEST_CASE("the reply parser reports malformed output") {
  struct Case {
    bool thinking;
    std::string text;
    std::string error, reasoning, reply, unparsed;
  };
  const std::string to_reply = "<|close|>think<|sep|><|open|>response<|sep|>";
  const std::string closure = "<|close|>response<|sep|><|close|>message<|sep|>";
  const std::vector<Case> cases = {
      {true, "think <|open|>more", "unexpected <|open|> in the think channel", "think ", "", "<|open|>more"},
      {true, "a<|close|>message<|sep|>", "unexpected <|close|> in the think channel", "a", "",
       "<|close|>message<|sep|>"},
      {true, "a<|close|>think<|sep|>b", "unexpected <|close|> in the think channel", "a", "",
       "<|close|>think<|sep|>b"},
      {true, "a[EOS]", "[EOS] before the think channel was closed", "a", "", "[EOS]"},
      {true, "a" + to_reply + "b<|end_of_msg|>", "<|end_of_msg|> before the response channel was closed", "a",
       "b", "<|end_of_msg|>"},
      {true, "a" + to_reply + "b<|sep|>", "unexpected <|sep|> in the response channel", "a", "b", "<|sep|>"},
      {true, "a" + to_reply + "b" + to_reply, "unexpected <|close|> in the response channel", "a", "b",
       to_reply},
      {true, "a" + to_reply + "b" + closure + "\n<|end_of_msg|>",
       "expected <|end_of_msg|> or [EOS] after the closing sequence", "a", "b", "\n<|end_of_msg|>"},
      {true, "a" + to_reply + "b" + closure + "[EOS]more", "text after the end token", "a", "b", "more"},
      {true, "a" + to_reply + "b" + closure + "[EOS][EOS]", "text after the end token", "a", "b", "[EOS]"},
      {false, "x" + to_reply, "unexpected <|close|> in the response channel", "", "x", to_reply},
      {false, "x" + closure + "<|end_of_msg|> ", "text after the end token", "", "x", " "},
  };
  for (const Case& c : cases) {
    CAPTURE(c.text);
    for (size_t step : {c.text.size(), size_t{1}, size_t{5}}) {
      ReplyParser p(c.thinking);
      std::string r, a;
      for (size_t at = 0; at < c.text.size(); at += step) {
        const ReplyText t = p.feed(c.text.substr(at, step));
        r += t.reasoning;
        a += t.reply;
      }
      CHECK(p.state() == ReplyParser::State::malformed);
      CHECK(p.error() == c.error);
      CHECK(r == c.reasoning);
      CHECK(a == c.reply);
      CHECK(p.unparsed() == c.unparsed);
      // Nothing more comes out; later text is kept for display.
      CHECK(p.feed("tail").empty());
      CHECK(p.unparsed() == c.unparsed + "tail");
      CHECK(p.finish().empty());
      CHECK(p.state() == ReplyParser::State::malformed);
    }
  }
}

TEST_CASE("the reply parser at the end of the stream") {
  {
    // Cut off mid-reasoning: what was held is text after all.
    ReplyParser p(true);
    CHECK(p.feed("abc <|op").reasoning == "abc ");
    CHECK(p.finish().reasoning == "<|op");
    CHECK(p.state() == ReplyParser::State::truncated);
    CHECK(p.reasoning() == "abc <|op");
    CHECK(p.feed("more").empty());
    CHECK(p.message() == bot("", "abc <|op"));
    CHECK(p.closing() == cat({close_tag("think"),
                              open_tag("response"),
                              close_tag("response"),
                              close_tag("message"),
                              {C("<|end_of_msg|>")}}));
  }
  {
    ReplyParser p(false);
    p.feed("reply [EO");
    CHECK(p.finish().reply == "[EO");
    CHECK(p.state() == ReplyParser::State::truncated);
    CHECK(p.message() == bot("reply [EO"));
    CHECK(p.closing() == cat({close_tag("response"), close_tag("message"), {C("<|end_of_msg|>")}}));
  }
  {
    // The closing sequence without an end token: the message is complete.
    ReplyParser p(false);
    p.feed("ok<|close|>response<|sep|><|close|>message<|sep|>");
    CHECK(p.state() == ReplyParser::State::closed);
    CHECK(p.finish().empty());
    CHECK(p.state() == ReplyParser::State::done);
    CHECK(p.end_token() == EndToken::none);
    CHECK(p.closing() == std::vector<Segment>{C("<|end_of_msg|>")});
  }
  {
    // Cut inside the end token: done, and closing() writes the rest of it.
    ReplyParser p(false);
    p.feed("ok<|close|>response<|sep|><|close|>message<|sep|><|end_of");
    CHECK(p.finish().empty());
    CHECK(p.state() == ReplyParser::State::done);
    CHECK(p.end_token() == EndToken::none);
    CHECK(p.closing() == std::vector<Segment>{T("_msg|>")});
  }
  {
    // Cut inside the closing sequence: not reply text; closing() completes it.
    ReplyParser p(false);
    CHECK(p.feed("ok<|close|>resp").reply == "ok");
    CHECK(p.finish().empty());
    CHECK(p.state() == ReplyParser::State::truncated);
    CHECK(p.reply() == "ok");
    CHECK(p.closing() == std::vector<Segment>{T("onse"), C("<|sep|>"), C("<|close|>"), T("message"),
                                              C("<|sep|>"), C("<|end_of_msg|>")});
  }
  {
    ReplyParser p(true);
    CHECK(p.finish().empty());
    CHECK(p.state() == ReplyParser::State::truncated);
    CHECK(state_name(p.state()) == "truncated");
  }
}

TEST_CASE("generated text cut anywhere plus closing() is a whole message with the same split") {
  const ChatMessage msg = bot("The reply, with [brackets] and <angles>.", "Reasoning <|op and [EO.");
  for (bool thinking : {true, false}) {
    for (EndToken end : {EndToken::end_of_msg, EndToken::eos}) {
      CAPTURE(thinking);
      ChatOptions o;
      o.thinking = thinking;
      std::string text = join(render_completion(msg, o));
      if (end == EndToken::eos) text.replace(text.size() - kEndOfMsg.size(), kEndOfMsg.size(), kEos);
      for (size_t cut = 0; cut <= text.size(); ++cut) {
        CAPTURE(cut);
        ReplyParser p(thinking);
        p.feed(text.substr(0, cut));
        p.finish();
        REQUIRE(p.state() != ReplyParser::State::malformed);
        const std::string whole = text.substr(0, cut) + join(p.closing());
        ReplyParser q(thinking);
        q.feed(whole);
        CHECK(q.state() == ReplyParser::State::done);
        CHECK(q.reasoning() == p.reasoning());
        CHECK(q.reply() == p.reply());
        if (cut == text.size()) CHECK(p.closing().empty());
      }
    }
  }
  // Malformed output gets the closings of the channel it broke in.
  ReplyParser p(true);
  p.feed("a<|open|>b");
  CHECK(p.closing().size() == 13);
  ReplyParser r(false);
  r.feed("a<|sep|>");
  CHECK(r.closing() == cat({close_tag("response"), close_tag("message"), {C("<|end_of_msg|>")}}));
}
