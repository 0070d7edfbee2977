// K3's chat format with tools (io/text/xtml_tools.hpp, docs/chat.md "Tools"): exact segments for
// known conversations, written out from the reference encoder's rules (encoding_k3.py: the
// tool-declare message first, keys sorted and compact; typed argument blocks; tool results in call
// order with their tool name and index; the tool-choice message before the generation prompt), and
// generated tool calls read back by ReplyParser, for every chunking and every cut.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "io/error.hpp"
#include "io/text/xtml.hpp"
#include "io/text/xtml_tools.hpp"
#include "tests/xtml_segments.hpp"

using namespace k3::io::text;
using Role = ChatMessage::Role;
using k3::test::C;
using k3::test::close_tag;
using k3::test::open_tag;
using k3::test::T;

namespace {

std::vector<Segment> message(std::vector<std::string> attrs, const std::string& body) {
  std::vector<Segment> s = open_tag("message", std::move(attrs));
  if (!body.empty()) s.push_back(T(body));
  for (auto& x : close_tag("message")) s.push_back(x);
  s.push_back(C("<|end_of_msg|>"));
  return s;
}
std::vector<Segment> cat(std::initializer_list<std::vector<Segment>> parts) {
  std::vector<Segment> out;
  for (const auto& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}
std::vector<Segment> argument(const std::string& key, const std::string& type, const std::string& value) {
  return cat({open_tag("argument", {" key=\"" + key + "\"", " type=\"" + type + "\""}),
              {T(value)},
              close_tag("argument")});
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

ChatMessage usr(std::string c) {
  return {Role::user, std::move(c)};
}
ChatMessage calls(std::vector<ToolCall> c, std::string content = "") {
  ChatMessage m{Role::assistant, std::move(content)};
  m.tool_calls = std::move(c);
  return m;
}
ChatMessage result(std::string id, std::string content, std::optional<std::string> name = std::nullopt) {
  ChatMessage m{Role::tool, std::move(content)};
  m.tool_call_id = std::move(id);
  m.name = std::move(name);
  return m;
}

ChatOptions no_thinking() {
  return ChatOptions(false, "max");
}

// Keys out of order on purpose: the render sorts them at every depth.
const std::string kWeather =
    R"([{"type":"function","function":{"name":"get_weather","description":"Get weather",)"
    R"("parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}}])";

}  // namespace

TEST_CASE("tool declarations come first, keys sorted and compact, before the effort message") {
  ChatOptions o;
  o.tools = kWeather;
  const std::string body =
      "# Tools\nHere are the available tools, described in JSONSchema.\n\n```json\n"
      R"([{"function":{"description":"Get weather","name":"get_weather","parameters":{"properties":)"
      R"({"city":{"type":"string"}},"required":["city"],"type":"object"}},"type":"function"}])"
      "\n```";
  const auto segs = render(std::vector<ChatMessage>{usr("weather?")}, true, o);
  const auto want_head = message({" role=\"system\"", " type=\"tool-declare\""}, body);
  REQUIRE(segs.size() > want_head.size());
  CHECK(std::vector<Segment>(segs.begin(), segs.begin() + long(want_head.size())) == want_head);
  // Then the effort message, the user message and the generation prompt, as without tools.
  ChatOptions plain;
  const auto without = render(std::vector<ChatMessage>{usr("weather?")}, true, plain);
  CHECK(std::vector<Segment>(segs.begin() + long(want_head.size()), segs.end()) == without);
  // The prefix of a live chat starts the same way.
  const auto prefix = render_prefix(std::nullopt, o);
  CHECK(std::vector<Segment>(prefix.begin(), prefix.begin() + long(want_head.size())) == want_head);
  // Non-ASCII passes through unescaped; numbers keep Python's spelling.
  std::string out;
  REQUIRE(py_json_text(R"({"b":[1,2.5,1e2,-0.0,1e-7,true,null],"a":"é\n\u0001"})",
                       PyJsonStyle{.compact = true, .sort_keys = true}, out));
  CHECK(out == "{\"a\":\"é\\n\\u0001\",\"b\":[1,2.5,100.0,-0.0,1e-07,true,null]}");
}

TEST_CASE("an assistant message with tool calls, and the tool results in call order") {
  const std::vector<ChatMessage> conv = {
      usr("go"),
      calls({{"a", "f1",
              R"({"s":"text","n":5,"fl":1.5,"b":true,"nil":null,"obj":{"k":"v","j":[]},"arr":[1,"two"]})"},
             {"b", "f2", ""}}),
      result("b", "r2", "stale"),  // out of order, and a name the call overrides
      result("a", "r1"),
      ChatMessage{Role::assistant, "done"},
      usr("again")};
  const auto segs = render(conv, true, no_thinking());
  const auto want = cat({
      message({" role=\"user\""}, "go"),
      open_tag("message", {" role=\"assistant\""}),
      open_tag("response"),
      close_tag("response"),
      open_tag("tools"),
      open_tag("call", {" tool=\"f1\"", " index=\"1\""}),
      argument("s", "string", "text"),
      argument("n", "number", "5"),
      argument("fl", "number", "1.5"),
      argument("b", "boolean", "true"),
      argument("nil", "null", "null"),
      argument("obj", "object", R"({"k": "v", "j": []})"),
      argument("arr", "array", R"([1, "two"])"),
      close_tag("call"),
      open_tag("call", {" tool=\"f2\"", " index=\"2\""}),
      close_tag("call"),
      close_tag("tools"),
      close_tag("message"),
      {C("<|end_of_msg|>")},
      message({" role=\"tool\"", " tool=\"f1\"", " index=\"1\""}, "r1"),
      message({" role=\"tool\"", " tool=\"f2\"", " index=\"2\""}, "r2"),
      open_tag("message", {" role=\"assistant\""}),
      open_tag("response"),
      {T("done")},
      close_tag("response"),
      close_tag("message"),
      {C("<|end_of_msg|>")},
      message({" role=\"user\""}, "again"),
      open_tag("message", {" role=\"assistant\""}),
      open_tag("response"),
  });
  CHECK(segs == want);
}

TEST_CASE("tool results: names by position or their own, escaped attributes, json blocks") {
  // No ids: the result takes the name of the call at its position.
  auto segs = render(std::vector<ChatMessage>{usr("go"), calls({{"", "positional", "{}"}}), result("", "r")},
                     true, no_thinking());
  const auto tool = message({" role=\"tool\"", " tool=\"positional\"", " index=\"1\""}, "r");
  CHECK(std::search(segs.begin(), segs.end(), tool.begin(), tool.end()) != segs.end());
  // An id no call has: the result's own name.
  segs = render(std::vector<ChatMessage>{usr("go"), calls({{"a", "f1", "{}"}}), result("zzz", "r", "mine")},
                true, no_thinking());
  CHECK(std::find(segs.begin(), segs.end(), T(" tool=\"mine\"")) != segs.end());
  // Attribute values escape & then the quote; arguments that are not JSON are kept whole.
  segs = render(std::vector<ChatMessage>{usr("go"), calls({{"c1", "a&b\"c", R"({"k\"&":"v"})"}}),
                                         result("c1", "r"), calls({{"c2", "f", R"({"a": 1)"}})},
                false, no_thinking());
  CHECK(std::find(segs.begin(), segs.end(), T(" tool=\"a&amp;b&quot;c\"")) != segs.end());
  CHECK(std::find(segs.begin(), segs.end(), T(" key=\"k&quot;&amp;\"")) != segs.end());
  const auto json = cat({open_tag("json", {" type=\"object\""}), {T(R"({"a": 1)")}, close_tag("json")});
  CHECK(std::search(segs.begin(), segs.end(), json.begin(), json.end()) != segs.end());
  // A user's name is an attribute after the role.
  ChatMessage named = usr("hi");
  named.name = "alice";
  segs = render(std::vector<ChatMessage>{named}, false, no_thinking());
  CHECK(segs == message({" role=\"user\"", " name=\"alice\""}, "hi"));
}

TEST_CASE("tool choice: the tool-choice message before the generation prompt; named is forced") {
  ChatOptions o = no_thinking();
  o.tools = kWeather;
  const std::vector<ChatMessage> conv = {usr("q")};
  const auto base = render(conv, true, o);
  const auto gen = cat({open_tag("message", {" role=\"assistant\""}), open_tag("response")});
  for (auto [kind, body] :
       {std::pair{ToolChoice::Kind::required,
                  "The system is invoked with `tool_choice=required`.\nYou MUST call tools "
                  "in the next message."},
        std::pair{ToolChoice::Kind::none,
                  "The system is invoked with `tool_choice=none`.\nYou MUST NOT call any "
                  "tools in the next message."}}) {
    o.tool_choice = ToolChoice{kind, ""};
    const auto segs = render(conv, true, o);
    const auto want = cat({std::vector<Segment>(base.begin(), base.end() - long(gen.size())),
                           message({" role=\"system\"", " type=\"tool-choice\""}, body), gen});
    CHECK(segs == want);
  }
  // auto and none force nothing; required opens a call up to its name.
  o.tool_choice = ToolChoice{ToolChoice::Kind::none, ""};
  CHECK(forced_reply(o).empty());
  o.tool_choice = ToolChoice{};
  CHECK(forced_reply(o).empty());
  o.tool_choice = ToolChoice{ToolChoice::Kind::required, ""};
  CHECK(forced_reply(o) ==
        cat({close_tag("response"), open_tag("tools"), {C("<|open|>"), T("call"), T(" tool=\"")}}));
  o.tool_choice = ToolChoice{ToolChoice::Kind::named, "get_weather"};
  CHECK(forced_reply(o) == cat({close_tag("response"), open_tag("tools"),
                                open_tag("call", {" tool=\"get_weather\"", " index=\"1\""})}));
  o.thinking = true;
  CHECK(forced_reply(o) ==
        cat({close_tag("think"), open_tag("response"), close_tag("response"), open_tag("tools"),
             open_tag("call", {" tool=\"get_weather\"", " index=\"1\""})}));
  ChatOptions bare;
  bare.tool_choice = ToolChoice{ToolChoice::Kind::required, ""};
  CHECK(usage_message([&] { render(conv, true, bare); }) ==
        "chat: a tool choice other than auto needs tool declarations");
}

TEST_CASE("tool conversations that break the rules are refused, naming the message") {
  auto refusal = [](std::vector<ChatMessage> m, bool gen = true) {
    return usage_message([&] { render(m, gen, ChatOptions{}); });
  };
  CHECK(refusal({usr("a"), result("x", "r")}) == "chat: message 2: role is tool, expected assistant");
  CHECK(refusal({usr("a"), calls({{"x", "f", ""}})}) ==
        "chat: message 3: the tool calls of the last assistant message have no results");
  CHECK(refusal({usr("a"), calls({{"x", "f", ""}}), usr("b")}) ==
        "chat: message 3: role is user, expected tool");
  CHECK(refusal({usr("a"), calls({{"x", "f", "[1]"}}), result("x", "r")}) ==
        "chat: the arguments of tool call 'f' must be a JSON object");
  CHECK(refusal({usr("a"), calls({{"x", "", ""}}), result("x", "r")}) ==
        "chat: message 2: a tool call without a function name");
  CHECK(refusal({usr("a"), calls({{"x", "f", ""}, {"y", "g", ""}}), result("q", "r1"), result("z", "r2"),
                 result("w", "r3")})
            .starts_with("chat: message 5: a tool message whose tool_call_id names no call"));
  // Results may end the conversation (the generation prompt follows them), or an assistant reply.
  CHECK_NOTHROW(render(std::vector<ChatMessage>{usr("a"), calls({{"x", "f", ""}}), result("x", "r")}, true,
                       ChatOptions{}));
  for (const char* bad :
       {"{", "{}", R"([{"type":"function"}])", R"([{"type":"x","function":{"name":"f"}}])"}) {
    ChatOptions o;
    o.tools = bad;
    CHECK(usage_message([&] { validate(o); }).starts_with("tools"));
  }
  // Keys nobody reads are named, with the tool's index; null counts as absent; strict is a boolean.
  auto tools_refusal = [](std::string tools) {
    ChatOptions o;
    o.tools = std::move(tools);
    return usage_message([&] { validate(o); });
  };
  CHECK(tools_refusal(R"([{"type":"function","function":{"name":"f"}},{"type":"function","cache":1,)"
                      R"("function":{"name":"g"}}])") ==
        "tools[1]: unknown key 'cache' (known: type, function)");
  CHECK(tools_refusal(R"([{"type":"function","function":{"name":"f","args":{}}}])") ==
        "tools[0].function: unknown key 'args' (known: name, description, parameters, strict)");
  CHECK(tools_refusal(R"([{"type":"function","function":{"name":"f","strict":"yes"}}])") ==
        "tools[0].function: 'strict' must be true or false");
  CHECK(tools_refusal("[3]") == "tools[0]: must be an object");
  ChatOptions ok;
  ok.tools = R"([{"type":"function","cache":null,"function":{"name":"f","description":"d","parameters":{},)"
             R"("strict":true}}])";
  CHECK_NOTHROW(validate(ok));
}

namespace {

const std::string kCallsReply =
    "Let me look.<|close|>think<|sep|><|open|>response<|sep|>Checking.<|close|>response<|sep|>"
    "<|open|>tools<|sep|>"
    "<|open|>call tool=\"get_weather\" index=\"1\"<|sep|>"
    "<|open|>argument key=\"city\" type=\"string\"<|sep|>Paris \"FR\"<|close|>argument<|sep|>"
    "<|open|>argument key=\"days\" type=\"number\"<|sep|>3<|close|>argument<|sep|>"
    "<|open|>argument key=\"opts\" type=\"object\"<|sep|>{\"units\": \"C\"}<|close|>argument<|sep|>"
    "<|close|>call<|sep|>"
    "<|open|>call tool=\"a&amp;b\" index=\"2\"<|sep|><|close|>call<|sep|>"
    "<|open|>call tool=\"raw\" index=\"3\"<|sep|><|open|>json type=\"object\"<|sep|>{bad<|close|>json<|sep|>"
    "<|close|>call<|sep|>"
    "<|close|>tools<|sep|><|close|>message<|sep|>[EOS]";

const std::vector<ToolCall> kCalls = {
    {"", "get_weather", R"({"city":"Paris \"FR\"","days":3,"opts":{"units":"C"}})"},
    {"", "a&b", "{}"},
    {"", "raw", "{bad"},
};

}  // namespace

TEST_CASE("the reply parser reads parallel tool calls, whole, for every chunking") {
  for (size_t step : {kCallsReply.size(), size_t{1}, size_t{3}, size_t{7}}) {
    CAPTURE(step);
    ReplyParser p(true);
    std::vector<ToolCall> got;
    std::string reply;
    for (size_t at = 0; at < kCallsReply.size(); at += step) {
      ReplyText t = p.feed(kCallsReply.substr(at, step));
      reply += t.reply;
      got.insert(got.end(), t.calls.begin(), t.calls.end());
    }
    CHECK(p.finish().empty());
    CHECK(p.state() == ReplyParser::State::done);
    CHECK(reply == "Checking.");
    CHECK(p.reasoning() == "Let me look.");
    CHECK(got == kCalls);
    CHECK(p.calls() == kCalls);
    CHECK(p.closing().empty());
  }
  // Rendered back, a parsed reply is what the model wrote (the end token aside).
  ReplyParser p(true);
  p.feed(kCallsReply);
  const std::string back = join(render_completion(p.message(), ChatOptions{}));
  CHECK(back.substr(0, back.size() - 14) == kCallsReply.substr(0, kCallsReply.size() - 5));
}

TEST_CASE("a reply cut in the tools block: calls seen so far, closing() ends the message") {
  const std::string close_call = "<|close|>call<|sep|>";
  const size_t last_call = kCallsReply.rfind(close_call) + close_call.size();
  for (size_t cut = kCallsReply.find("<|close|>response"); cut <= kCallsReply.size(); ++cut) {
    CAPTURE(cut);
    ReplyParser p(true);
    p.feed(kCallsReply.substr(0, cut));
    p.finish();
    REQUIRE(p.state() != ReplyParser::State::malformed);
    // Every call whose closing arrived, and no part of one that did not.
    size_t whole = 0;
    for (size_t at = kCallsReply.find(close_call); at != std::string::npos && at + close_call.size() <= cut;
         at = kCallsReply.find(close_call, at + 1))
      ++whole;
    CHECK(p.calls() == std::vector<ToolCall>(kCalls.begin(), kCalls.begin() + long(whole)));
    // Between calls and after the last one, the closings make a whole message with the same calls.
    const bool between = cut >= last_call || cut < kCallsReply.find("<|open|>call");
    if (!between) continue;
    ReplyParser q(true);
    q.feed(kCallsReply.substr(0, cut) + join(p.closing()));
    CHECK(q.state() == ReplyParser::State::done);
    CHECK(q.calls() == p.calls());
    CHECK(q.reply() == p.reply());
  }
}

TEST_CASE("malformed tool blocks") {
  const std::string head = "x<|close|>response<|sep|><|open|>tools<|sep|>";
  struct Case {
    std::string text, error;
  };
  for (const Case& c : std::vector<Case>{
           {head + "hello", "expected a tool call or the end of the tools block"},
           {head + "<|open|>call tool=\"f\"<|sep|>oops<|close|>call<|sep|>",
            "a tool call body that is not argument blocks"},
           {head + "<|open|>call name=\"f\"<|sep|><|close|>call<|sep|>",
            "a tool call without a tool attribute"},
           {head + "<|open|>call tool=\"f\"<|sep|>[EOS]", "[EOS] inside a tool call"},
       }) {
    CAPTURE(c.text);
    ReplyParser p(false);
    p.feed(c.text);
    CHECK(p.state() == ReplyParser::State::malformed);
    CHECK(p.error() == c.error);
  }
}

TEST_CASE("a live chat with tools: prefix + turn + calls + results + generation prompt equal the render") {
  for (bool thinking : {true, false}) {
    CAPTURE(thinking);
    ChatOptions o(thinking, "high");
    o.tools = kWeather;
    ChatMessage asked =
        calls({{"call_1", "get_weather", R"({"city":"Oslo"})"}, {"call_2", "get_weather", ""}});
    if (thinking) asked.reasoning = "Two cities.";
    std::vector<ChatMessage> conv = {usr("Oslo and Rome?"), asked, result("call_1", "-3C", "get_weather"),
                                     result("call_2", "18C", "get_weather")};
    std::vector<Segment> live = render_prefix(std::nullopt, o);
    for (const auto& part :
         {render_turn(conv[0], o), render_completion(conv[1], o), render_tool_result(conv[2], 1),
          render_tool_result(conv[3], 2), render_generation_prompt(o)})
      live.insert(live.end(), part.begin(), part.end());
    CHECK(live == render(conv, true, o));
  }
  CHECK(usage_message([] { render_tool_result(result("x", "r"), 1); }) ==
        "chat: a tool result needs the tool role and the tool's name");
}

TEST_CASE("a forced reply fed first: the model's text completes the call it opens") {
  for (bool thinking : {true, false}) {
    CAPTURE(thinking);
    ChatOptions o(thinking, "max");
    o.tools = kWeather;
    o.tool_choice = ToolChoice{ToolChoice::Kind::required, ""};
    ReplyParser p(thinking);
    CHECK(p.feed(join(forced_reply(o))).empty());
    CHECK(p.state() == ReplyParser::State::tools);
    const ReplyText t = p.feed(
        "get_weather\" index=\"1\"<|sep|><|open|>argument key=\"city\" type=\"string\"<|sep|>Rome"
        "<|close|>argument<|sep|><|close|>call<|sep|><|close|>tools<|sep|><|close|>message<|sep|>[EOS]");
    CHECK(t.calls == std::vector<ToolCall>{{"", "get_weather", R"({"city":"Rome"})"}});
    CHECK(t.reply.empty());
    CHECK(p.state() == ReplyParser::State::done);
  }
}
