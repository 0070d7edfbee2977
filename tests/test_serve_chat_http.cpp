// `k3flow serve` chat requests over loopback on fixtures/tiny-k3: serve --thinking sets the default
// a request may override, --max-reply is a chat request's default length and every request's cap,
// tools and a named tool choice are accepted streamed and not, the developer role and tool results
// are accepted, and an unknown field is a 400 naming it while the server keeps serving; so is an
// unknown key inside a nested object (by its path) and a content part that is not text.
#include <doctest/doctest.h>
#include <fmt/format.h>
#include <simdjson.h>

#include <string>
#include <vector>

#include "tests/run_helpers.hpp"
#include "tests/test_serve_client.hpp"

using namespace k3::test;

namespace {

const std::string kTiny = std::string(K3_FIXTURES) + "/tiny-k3";
const std::string kTools =
    R"([{"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{"city":{"type":"string"}}}}}])";

struct Reply {
  int status = 0;
  std::string content, finish, error;
  bool has_reasoning = false, null_content = false;
  int64_t completion_tokens = -1;
};

Reply chat(int port, const std::string& body) {
  const HttpResponse r = http(port, "POST", "/v1/chat/completions", body);
  Reply out;
  out.status = r.status;
  simdjson::dom::parser p;
  const simdjson::padded_string text(r.body);
  simdjson::dom::element j = p.parse(text);
  if (r.status != 200) {
    out.error = std::string(std::string_view(j["error"]["message"]));
    return out;
  }
  auto choice = j["choices"].at(0);
  auto msg = choice["message"];
  out.null_content = msg["content"].is_null();
  if (!out.null_content) out.content = std::string(std::string_view(msg["content"]));
  out.has_reasoning = msg["reasoning_content"].error() == simdjson::SUCCESS;
  out.finish = std::string(std::string_view(choice["finish_reason"]));
  out.completion_tokens = int64_t(j["usage"]["completion_tokens"]);
  return out;
}

}  // namespace

TEST_CASE("chat over HTTP: --thinking off and --max-reply defaults, tools, roles, unknown fields") {
  ServeChild s(kTiny + " --thinking off --max-reply 6");
  const std::string user =
      R"("messages":[{"role":"developer","content":"Be brief."},{"role":"user","content":"Hi"}])";
  // No thinking field: off, the reply is content at once; no max_tokens: --max-reply.
  Reply r = chat(s.port(), "{" + user + R"(,"ignore_eos":true})");
  REQUIRE(r.status == 200);
  CHECK_FALSE(r.has_reasoning);
  CHECK(!r.content.empty());
  CHECK(r.completion_tokens == 6);
  CHECK(r.finish == "length");
  // The request's own switch wins; a larger max_tokens is clamped to the cap.
  r = chat(s.port(), "{" + user + R"(,"thinking":true,"max_tokens":100,"ignore_eos":true})");
  REQUIRE(r.status == 200);
  CHECK(r.has_reasoning);
  CHECK(r.completion_tokens == 6);

  // Tools with a named choice, streamed: a well-formed stream (the byte-level model writes noise
  // into the forced call, which never closes, so no call comes back and the finish is length).
  const std::string tools_body =
      "{" + user + R"(,"tools":)" + kTools +
      R"(,"tool_choice":{"type":"function","function":{"name":"get_weather"}},"ignore_eos":true)";
  const HttpResponse st = http(s.port(), "POST", "/v1/chat/completions", tools_body + R"(,"stream":true})");
  REQUIRE(st.status == 200);
  const std::vector<std::string> ev = sse_data(st.body);
  REQUIRE(ev.size() >= 2);
  CHECK(ev.back() == "[DONE]");
  CHECK(ev[ev.size() - 2].find(R"("finish_reason":"length")") != std::string::npos);

  // A conversation with a call and its result.
  r = chat(
      s.port(),
      R"({"messages":[{"role":"user","content":"Weather?"},{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Oslo\"}"}}]},{"role":"tool","tool_call_id":"c1","content":"-3C"}],"tools":)" +
          kTools + "}");
  CHECK(r.status == 200);

  r = chat(s.port(), "{" + user + R"(,"logit_bias":{"5":1}})");
  CHECK(r.status == 400);
  CHECK(r.error.starts_with("'logit_bias' is not supported"));
  r = chat(s.port(), "{" + user + R"(,"tool_choice":"required"})");
  CHECK(r.status == 400);
  CHECK(r.error == "'tool_choice' other than auto needs 'tools'");
  CHECK(chat(s.port(), "{" + user + "}").status == 200);
  CHECK(s.stop(SIGTERM) == 0);
}

TEST_CASE("nested fields: unknown keys refused by their path, non-text parts by type; strict accepted") {
  ServeChild s(kTiny + " --thinking off --max-reply 2");
  const std::string user = R"("messages":[{"role":"user","content":"Hi"}])";
  const std::string named = R"("tool_choice":{"type":"function","function":{"name":"get_weather"}})";
  const std::string call =
      R"({"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"get_weather","arguments":"{}"}}]})";
  const auto with_call = [&](const std::string& c) {
    return R"({"messages":[{"role":"user","content":"Weather?"},)" + c +
           R"(,{"role":"tool","tool_call_id":"c1","content":"-3C"}],"tools":)" + kTools + "}";
  };
  const auto insert = [](std::string text, const std::string& after, const std::string& what) {
    return text.insert(text.find(after) + after.size(), what);
  };
  const std::vector<std::pair<std::string, std::string>> refused = {
      {"{" + user + R"(,"stream":true,"stream_options":{"include_usage":true,"chunk_size":4}})",
       "'stream_options.chunk_size' is not supported by this server"},
      {"{" + user + R"(,"stream":true,"stream_options":{"include_obfuscation":true}})",
       "'stream_options.include_obfuscation': true is not supported by this server"},
      {"{" + user + R"(,"tools":)" + kTools +
           R"(,"tool_choice":{"type":"function","function":{"name":"get_weather"},"allowed":[]}})",
       "'tool_choice.allowed' is not supported by this server"},
      {"{" + user + R"(,"tools":)" + kTools +
           R"(,"tool_choice":{"type":"function","function":{"name":"get_weather","args":{}}}})",
       "'tool_choice.function.args' is not supported by this server"},
      {with_call(insert(call, R"("id":"c1",)", R"("index":0,)")),
       "'messages[1].tool_calls[0].index' is not supported by this server"},
      {with_call(insert(call, R"("arguments":"{}")", R"(,"parsed":{})")),
       "'messages[1].tool_calls[0].function.parsed' is not supported by this server"},
      {R"({"messages":[{"role":"user","content":[{"type":"text","text":"Hi"},{"type":"image_url","image_url":{"url":"https://x/y.png"}}]}]})",
       "'messages[0].content[1].type' 'image_url' is not supported by this server (text parts only)"},
      {R"({"messages":[{"role":"user","content":[{"type":"text","text":"Hi","cache_control":{}}]}]})",
       "'messages[0].content[0].cache_control' is not supported by this server"},
      {R"({"messages":[{"role":"user","content":[{"text":"Hi"}]}]})",
       "messages[0].content[0].type is required (\"text\")"},
      {"{" + user + R"(,"tools":[{"type":"function","function":{"name":"f"},"cache":true}]})",
       "'tools[0].cache' is not supported by this server"},
      {"{" + user + R"(,"tools":[{"type":"function","function":{"name":"f","examples":[]}}]})",
       "'tools[0].function.examples' is not supported by this server"},
      {"{" + user + R"(,"tools":[{"type":"function","function":{"name":"f","strict":"yes"}}]})",
       "'tools[0].function.strict' must be true or false"},
  };
  for (const auto& want :
       refused) {  // not a structured binding: CAPTURE's lambda cannot take one in clang 14
    const std::string& body = want.first;
    CAPTURE(body);
    const Reply r = chat(s.port(), body);
    CHECK(r.status == 400);
    CHECK(r.error.starts_with(want.second));
  }
  // What the same places accept: text parts, strict, include_obfuscation false, a named choice and a
  // call echoed back in OpenAI's own shapes.
  const std::string strict_tools =
      R"([{"type":"function","function":{"name":"get_weather","description":"d","strict":true,"parameters":{"type":"object","properties":{}}}}])";
  for (const std::string& body :
       {std::string(R"({"messages":[{"role":"user","content":[{"type":"text","text":"Hi"}]}]})"),
        "{" + user + R"(,"tools":)" + strict_tools + "," + named + "}",
        "{" + user + R"(,"stream":true,"stream_options":{"include_usage":true,"include_obfuscation":false}})",
        with_call(call)}) {
    CAPTURE(body);
    CHECK(http(s.port(), "POST", "/v1/chat/completions", body).status == 200);
  }
  CHECK(s.stop(SIGTERM) == 0);
}

TEST_CASE("serve refuses a bad --thinking or --max-reply with exit 2") {
  for (const char* bad : {"--thinking maybe", "--max-reply 0"}) {
    CAPTURE(bad);
    const Run r = k3flow_sh(fmt::format("serve {} --port 0 {}", kTiny, bad), "", 60);
    CHECK(r.code == 2);
    CHECK(r.err.find(std::string(bad).substr(0, std::string(bad).find(' '))) != std::string::npos);
  }
}
