// pipeline/serve/api.*: the chat request's fields as they reach the prompt and the response, on the
// tiny model's tokenizer, without HTTP. Tools, tool results and the developer role reach the prompt
// as the XTML render of the same conversation (tests/test_xtml_tools.cpp pins that render); a named
// tool choice ends the prompt with the call's opening; unknown fields are refused by name;
// max_tokens defaults to and is capped by --max-reply; tool calls come back in OpenAI's shapes,
// whole and streamed. And through the scheduler: a reply whose think channel closes carries its
// answer in content; with parallel_tool_calls false a reply ends at its first complete call.
#include <doctest/doctest.h>
#include <fmt/format.h>
#include <simdjson.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "io/text/xtml.hpp"
#include "pipeline/run/decoder.hpp"
#include "pipeline/run/model_tokenizer.hpp"
#include "pipeline/serve/api.hpp"
#include "pipeline/serve/scheduler.hpp"

using namespace k3;
using namespace k3::pipeline::serve;
using namespace std::chrono_literals;
namespace text = k3::io::text;
using Role = text::ChatMessage::Role;

namespace {

const std::string kTiny = std::string(K3_FIXTURES) + "/tiny-k3";

struct Fixture {
  io::ModelConfig cfg = pipeline::load_model_config(kTiny, std::nullopt);
  text::Tokenizer tok = *pipeline::model_tokenizer(kTiny, std::nullopt, cfg, "--prompt");
  ApiContext ctx() const { return ApiContext{.model = "k3", .tok = tok, .capacity = 4096}; }

  std::vector<int32_t> encode(const std::vector<text::Segment>& segs) const {
    std::vector<int32_t> ids;
    for (const text::Segment& s : segs) {
      const auto part = tok.encode(s.text, s.control);
      ids.insert(ids.end(), part.begin(), part.end());
    }
    return ids;
  }
};

// A scheduler over the tiny model (1,024 positions a sequence), its load finished.
std::unique_ptr<Scheduler> ready_scheduler(const Fixture& f, int max_seqs, int queue) {
  pipeline::DecoderOptions dec;
  dec.model_dir = kTiny;
  dec.capacity = 1024;
  dec.stream.no_progress = true;
  auto sched = std::make_unique<Scheduler>(
      SchedulerOptions{.dec = dec, .max_seqs = max_seqs, .queue = queue, .prefill = {}}, f.cfg, f.tok);
  REQUIRE(sched->wait_until_settled(60s));
  REQUIRE(sched->phase() == Phase::ready);
  return sched;
}

const std::string kTools =
    R"([{"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{"city":{"type":"string"}}}}}])";

std::string error_of(Endpoint ep, const std::string& body, const ApiContext& ctx) {
  try {
    parse_request(ep, body, ctx);
  } catch (const ApiError& e) {
    CHECK(e.status == 400);
    return e.what();
  }
  return "(accepted)";
}

}  // namespace

TEST_CASE("tools, tool calls, tool results and the developer role reach the prompt as their render") {
  Fixture f;
  const std::string body = R"({"messages":[
      {"role":"developer","content":"Be brief."},
      {"role":"user","content":"Weather in Paris?","name":"ann"},
      {"role":"assistant","content":null,"reasoning_content":"Need data.","tool_calls":[
        {"id":"c1","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}},
        {"id":"c2","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Lyon\"}"}}]},
      {"role":"tool","tool_call_id":"c2","content":"12C"},
      {"role":"tool","tool_call_id":"c1","content":"15C"}],
    "tools":)" + kTools + R"(,"tool_choice":"required","max_tokens":4})";
  const ApiRequest r = parse_request(Endpoint::chat, body, f.ctx());

  text::ChatMessage user{Role::user, "Weather in Paris?"};
  user.name = "ann";
  text::ChatMessage calls{Role::assistant, "", "Need data."};
  calls.tool_calls = {{"c1", "get_weather", R"({"city":"Paris"})"},
                      {"c2", "get_weather", R"({"city":"Lyon"})"}};
  text::ChatMessage r2{Role::tool, "12C"}, r1{Role::tool, "15C"};
  r2.tool_call_id = "c2";
  r1.tool_call_id = "c1";
  text::ChatOptions o;
  o.tools = kTools;
  o.tool_choice.kind = text::ToolChoice::Kind::required;
  const std::vector<text::ChatMessage> conv = {{Role::system, "Be brief."}, user, calls, r2, r1};
  // tool_choice required: the render, then a call opened up to its name (the model names it).
  std::vector<text::Segment> segs = text::render(conv, true, o);
  const std::vector<text::Segment> forced = text::forced_reply(o);
  segs.insert(segs.end(), forced.begin(), forced.end());
  CHECK(r.gen.prompt == f.encode(segs));
  CHECK(
      r.gen.reply_prefix ==
      R"(<|close|>think<|sep|><|open|>response<|sep|><|close|>response<|sep|><|open|>tools<|sep|><|open|>call tool=")");
  CHECK(r.gen.chat);
  CHECK(r.gen.max_calls == 0);
  // The declarations are in the prompt's text, and so is each result under its call's name.
  const std::string prompt = f.tok.decode(r.gen.prompt);
  CHECK(prompt.find(R"("name":"get_weather")") != std::string::npos);
  CHECK(prompt.find(R"(role="tool" tool="get_weather" index="1"<|sep|>15C)") != std::string::npos);
}

TEST_CASE("a named tool choice ends the prompt with the call's opening; parallel_tool_calls false") {
  Fixture f;
  const std::string body =
      R"({"messages":[{"role":"user","content":"Hi"}],"thinking":false,"parallel_tool_calls":false,"tools":)" +
      kTools + R"(,"tool_choice":{"type":"function","function":{"name":"get_weather"}}})";
  const ApiRequest r = parse_request(Endpoint::chat, body, f.ctx());
  text::ChatOptions o(false, "max");
  o.tools = kTools;
  o.tool_choice = text::ToolChoice{text::ToolChoice::Kind::named, "get_weather"};
  std::vector<text::Segment> segs = text::render(std::vector<text::ChatMessage>{{Role::user, "Hi"}}, true, o);
  const std::vector<text::Segment> forced = text::forced_reply(o);
  segs.insert(segs.end(), forced.begin(), forced.end());
  CHECK(r.gen.prompt == f.encode(segs));
  CHECK(r.gen.reply_prefix ==
        R"(<|close|>response<|sep|><|open|>tools<|sep|><|open|>call tool="get_weather" index="1"<|sep|>)");
  CHECK(r.gen.max_calls == 1);
}

TEST_CASE("fields: unknown ones refused by name, null ones absent; bad tool fields named") {
  Fixture f;
  const ApiContext ctx = f.ctx();
  const std::string user = R"("messages":[{"role":"user","content":"Hi"}])";
  CHECK(error_of(Endpoint::chat, "{" + user + R"(,"logit_bias":{"1":5}})", ctx)
            .starts_with("'logit_bias' is not supported"));
  CHECK(
      error_of(Endpoint::chat, "{" + user + R"(,"echo":true})", ctx).starts_with("'echo' is not supported"));
  CHECK(error_of(Endpoint::completions, R"({"prompt":"x","tools":[]})", ctx)
            .starts_with("'tools' is not supported"));
  CHECK(error_of(Endpoint::completions, R"({"prompt":"x","suffix":"y"})", ctx).starts_with("'suffix'"));
  CHECK(error_of(Endpoint::chat, "{" + user + R"(,"logit_bias":null,"user":"u1","n":1})", ctx) ==
        "(accepted)");
  // Fields another part of the server reads are accepted here.
  CHECK(
      error_of(
          Endpoint::chat,
          "{" + user +
              R"(,"logprobs":false,"top_logprobs":null,"presence_penalty":0,"frequency_penalty":0,"response_format":{"type":"text"}})",
          ctx) == "(accepted)");
  CHECK(error_of(Endpoint::chat, R"({"messages":[{"role":"user","content":"Hi","audio":{"id":"a"}}]})",
                 ctx) == "messages[0].audio is not supported on a user message");
  CHECK(error_of(Endpoint::chat, R"({"messages":[{"role":"user","content":"Hi","tool_calls":[]}]})", ctx) ==
        "messages[0].tool_calls is not supported on a user message");
  CHECK(error_of(Endpoint::chat, R"({"messages":[{"role":"robot","content":"x"}]})", ctx)
            .starts_with("messages[0].role 'robot'"));
  CHECK(error_of(Endpoint::chat, "{" + user + R"(,"tool_choice":"required"})", ctx) ==
        "'tool_choice' other than auto needs 'tools'");
  CHECK(error_of(Endpoint::chat, "{" + user + R"(,"tools":)" + kTools + R"(,"tool_choice":"any"})", ctx)
            .starts_with("'tool_choice' any"));
  CHECK(error_of(Endpoint::chat,
                 "{" + user + R"(,"tools":)" + kTools +
                     R"(,"tool_choice":{"type":"function","function":{"name":"nope"}}})",
                 ctx) == "'tool_choice' names 'nope', which 'tools' does not declare");
  CHECK(error_of(Endpoint::chat, "{" + user + R"(,"tools":[{"type":"function"}]})", ctx)
            .starts_with("'tools'[0]: 'function.name'"));
  CHECK(
      error_of(
          Endpoint::chat,
          R"({"messages":[{"role":"user","content":"Hi"},{"role":"tool","tool_call_id":"x","content":"r"}]})",
          ctx) == "messages[1]: role is tool, expected assistant");
  CHECK(
      error_of(
          Endpoint::chat,
          R"({"messages":[{"role":"user","content":"Hi"},{"role":"assistant","tool_calls":[{"id":"x","type":"function","function":{"name":"f","arguments":"[1]"}}]},{"role":"tool","tool_call_id":"x","content":"r"}]})",
          ctx) == "chat: the arguments of tool call 'f' must be a JSON object");
}

TEST_CASE("max_tokens: --max-reply is the chat default and every request's cap; thinking's default") {
  Fixture f;
  ApiContext ctx = f.ctx();
  ctx.max_reply = 40;
  const std::string chat = R"({"messages":[{"role":"user","content":"Hi"}])";
  CHECK(parse_request(Endpoint::chat, chat + "}", ctx).gen.max_tokens == 40);
  CHECK(parse_request(Endpoint::chat, chat + R"(,"max_tokens":900})", ctx).gen.max_tokens == 40);
  CHECK(parse_request(Endpoint::chat, chat + R"(,"max_completion_tokens":7})", ctx).gen.max_tokens == 7);
  CHECK(parse_request(Endpoint::completions, R"({"prompt":"x"})", ctx).gen.max_tokens == 16);
  CHECK(parse_request(Endpoint::completions, R"({"prompt":"x","max_tokens":41})", ctx).gen.max_tokens == 40);
  ctx.max_reply = 10;
  CHECK(parse_request(Endpoint::completions, R"({"prompt":"x"})", ctx).gen.max_tokens == 10);

  // serve --thinking off: a request that does not say renders without the think channel; one that
  // says wins.
  ctx.thinking = false;
  const ApiRequest off = parse_request(Endpoint::chat, chat + "}", ctx);
  CHECK_FALSE(off.gen.thinking);
  CHECK(off.gen.prompt == f.encode(text::render(std::vector<text::ChatMessage>{{Role::user, "Hi"}}, true,
                                                text::ChatOptions(false, "max"))));
  CHECK(parse_request(Endpoint::chat, chat + R"(,"thinking":true})", ctx).gen.thinking);
  // echo: the prompt's own text.
  CHECK(parse_request(Endpoint::completions, R"({"prompt":"Say\u00e9","echo":true})", ctx).echo == "Sayé");
  CHECK(parse_request(Endpoint::completions, R"({"prompt":"Say","echo":false})", ctx).echo.empty());
}

namespace {

simdjson::padded_string padded(const std::string& s) {
  return simdjson::padded_string(s);
}

}  // namespace

TEST_CASE("tool calls in the response: OpenAI's shapes, whole and streamed; echo") {
  Fixture f;
  const ApiRequest r = parse_request(
      Endpoint::chat,
      R"({"messages":[{"role":"user","content":"Hi"}],"tools":)" + kTools + R"(,"stream":true})", f.ctx());
  Delta d1{.text = "Let me check.", .reasoning = "", .ids = {1, 2}, .logprobs = {}, .tool_calls = {}};
  Delta d2{.text = "",
           .reasoning = "",
           .ids = {3},
           .logprobs = {},
           .tool_calls = {{"get_weather", R"({"city":"Paris"})"}, {"get_weather", R"({"city":"Lyon"})"}}};
  const Outcome done{.finish = Finish::stop, .error = {}, .prompt_tokens = 5, .completion_tokens = 3};

  ResponseBuilder whole(r, "k3", "chatcmpl-x", 7);
  whole.add(d1);
  whole.add(d2);
  simdjson::dom::parser p;
  const auto b = padded(whole.body(done));
  simdjson::dom::element j = p.parse(b);
  auto choice = j["choices"].at(0);
  CHECK(std::string_view(choice["finish_reason"]) == "tool_calls");
  CHECK(std::string_view(choice["message"]["content"]) == "Let me check.");
  auto calls = choice["message"]["tool_calls"];
  REQUIRE(simdjson::dom::array(calls).size() == 2);
  CHECK(std::string_view(calls.at(0)["id"]) == "call_chatcmpl-x_0");
  CHECK(std::string_view(calls.at(1)["id"]) == "call_chatcmpl-x_1");
  CHECK(std::string_view(calls.at(1)["type"]) == "function");
  CHECK(std::string_view(calls.at(1)["function"]["name"]) == "get_weather");
  CHECK(std::string_view(calls.at(1)["function"]["arguments"]) == R"({"city":"Lyon"})");
  // Only calls: content is null. Cut by max_tokens after a call: length.
  ResponseBuilder only(r, "k3", "c", 7);
  only.add(d2);
  const auto ob = padded(
      only.body(Outcome{.finish = Finish::length, .error = {}, .prompt_tokens = 5, .completion_tokens = 1}));
  simdjson::dom::parser p2;
  simdjson::dom::element oj = p2.parse(ob);
  CHECK(oj["choices"].at(0)["message"]["content"].is_null());
  CHECK(std::string_view(oj["choices"].at(0)["finish_reason"]) == "length");

  // Streamed: the calls in the delta with their index and id, then finish_reason tool_calls.
  ResponseBuilder s(r, "k3", "chatcmpl-x", 7);
  CHECK(!s.event(d1).empty());
  const std::string ev = s.event(d2);
  REQUIRE(ev.starts_with("data: "));
  const auto eb = padded(ev.substr(6));
  simdjson::dom::parser p3;
  simdjson::dom::element ej = p3.parse(eb);
  auto delta = ej["choices"].at(0)["delta"];
  CHECK(delta["content"].error() == simdjson::NO_SUCH_FIELD);
  CHECK(int64_t(delta["tool_calls"].at(1)["index"]) == 1);
  CHECK(std::string_view(delta["tool_calls"].at(1)["id"]) == "call_chatcmpl-x_1");
  CHECK(std::string_view(delta["tool_calls"].at(0)["function"]["arguments"]) == R"({"city":"Paris"})");
  CHECK(s.final_events(done).find(R"("finish_reason":"tool_calls")") != std::string::npos);

  // echo: the prompt before the text, in the body and in the first streamed chunk.
  const ApiRequest e = parse_request(Endpoint::completions, R"({"prompt":"Hey","echo":true})", f.ctx());
  ResponseBuilder eb1(e, "k3", "cmpl-x", 7);
  eb1.add(d1);
  CHECK(eb1.body(done).find(R"("text":"HeyLet me check.")") != std::string::npos);
  ResponseBuilder eb2(e, "k3", "cmpl-x", 7);
  CHECK(eb2.event(d1).find(R"("text":"HeyLet me check.")") != std::string::npos);
  CHECK(eb2.event(d1).find(R"("text":"Let me check.")") != std::string::npos);
  ResponseBuilder eb3(e, "k3", "cmpl-x", 7);  // nothing generated: the echo still comes
  CHECK(eb3.final_events(done).find(R"("text":"Hey")") != std::string::npos);
}

TEST_CASE("a reply whose think channel closes carries its answer in content") {
  Fixture f;
  const std::unique_ptr<Scheduler> held = ready_scheduler(f, 2, 4);
  Scheduler& sched = *held;
  const std::vector<int32_t> prompt =
      f.encode(text::render(std::vector<text::ChatMessage>{{Role::user, "Hi"}}, true, text::ChatOptions{}));
  struct Got {
    std::string text, reasoning;
    std::vector<int32_t> ids;
  };
  const auto run = [&](const std::string& prefix) {
    GenRequest g;
    g.prompt = prompt;
    g.max_tokens = 24;
    g.chat = true;
    g.thinking = true;
    g.reply_prefix = prefix;
    g.ignore_eos = true;
    auto ch = std::make_shared<Channel>();
    REQUIRE(sched.submit(g, ch) == Scheduler::Submit::queued);
    Got got;
    const auto until = std::chrono::steady_clock::now() + 120s;
    while (!ch->done() && std::chrono::steady_clock::now() < until)
      if (auto d = ch->next(50ms)) {
        got.text += d->text;
        got.reasoning += d->reasoning;
        got.ids.insert(got.ids.end(), d->ids.begin(), d->ids.end());
      }
    REQUIRE(ch->done());
    CHECK(ch->outcome()->finish == Finish::length);
    return got;
  };
  // The byte-level model never closes the channel itself: its whole reply is reasoning. With the
  // think channel closed (as the model would close it), the same ids are the answer, in content.
  const Got open = run("");
  const Got closed = run("<|close|>think<|sep|><|open|>response<|sep|>");
  CHECK(open.ids.size() == 24);
  CHECK(open.ids == closed.ids);
  CHECK(open.text.empty());
  CHECK(!open.reasoning.empty());
  CHECK(closed.reasoning.empty());
  CHECK(closed.text == open.reasoning);
}

TEST_CASE("parallel_tool_calls false: the reply stops as soon as its first call is complete") {
  Fixture f;
  const std::unique_ptr<Scheduler> held = ready_scheduler(f, 1, 2);
  Scheduler& sched = *held;
  // The byte-level model never writes a call. The reply is started for it, as the forced tool choice
  // starts one: K3's text of two calls, cut inside the second one's arguments, so the first call is
  // complete before the first sampled token and the model goes on writing the second call's value.
  text::ChatOptions o(false, "max");
  o.tools = kTools;
  text::ChatMessage two{Role::assistant, ""};
  two.tool_calls = {{"", "get_weather", R"({"city":"Paris"})"}, {"", "get_weather", R"({"city":"Lyon"})"}};
  const std::string whole = text::join(text::render_completion(two, o));
  const std::string prefix = whole.substr(0, whole.find("Lyon"));
  REQUIRE(prefix.size() < whole.size());
  const auto run = [&](bool parallel) {
    ApiRequest r = parse_request(
        Endpoint::chat,
        fmt::format(
            R"({{"messages":[{{"role":"user","content":"Weather?"}}],"thinking":false,"tools":{},"parallel_tool_calls":{},"ignore_eos":true,"max_tokens":12}})",
            kTools, parallel ? "true" : "false"),
        f.ctx());
    CHECK(r.gen.max_calls == (parallel ? 0 : 1));
    r.gen.reply_prefix = prefix;
    const std::vector<int32_t> ids = f.tok.encode(prefix, true);
    r.gen.prompt.insert(r.gen.prompt.end(), ids.begin(), ids.end());
    auto ch = std::make_shared<Channel>();
    REQUIRE(sched.submit(r.gen, ch) == Scheduler::Submit::queued);
    const auto until = std::chrono::steady_clock::now() + 120s;
    while (!ch->done() && std::chrono::steady_clock::now() < until) ch->next(50ms);
    REQUIRE(ch->done());
    return *ch->outcome();
  };
  // Calls in parallel: the model writes on inside the second call until max_tokens.
  const Outcome all = run(true);
  CHECK(all.finish == Finish::length);
  CHECK(all.completion_tokens == 12);
  // One call: the first sampled token already follows a complete call, and the reply ends there.
  const Outcome one = run(false);
  CHECK(one.finish == Finish::stop);
  CHECK(one.completion_tokens == 1);
}
