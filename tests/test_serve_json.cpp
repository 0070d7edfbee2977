// `k3flow serve` on the tiny model over loopback HTTP: response_format gives JSON that parses and
// matches the schema with the ids `generate --json-schema` gives, logprobs are the log-softmax of
// the logits `generate --dump-logits` writes, and the new fields' bad values are refused by name.
#include <doctest/doctest.h>
#include <simdjson.h>

#include <cmath>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "tests/run_helpers.hpp"
#include "tests/temp_dir.hpp"
#include "tests/test_serve_client.hpp"

using namespace k3::test;

namespace {

const std::string kTiny = std::string(K3_FIXTURES) + "/tiny-k3";

const char* kSchema =
    R"({"type":"object","properties":{"n":{"type":"integer"},"ok":{"type":"boolean"},)"
    R"("c":{"enum":["red","green"]}},"required":["n","ok","c"],"additionalProperties":false})";

std::vector<int32_t> ids_of(simdjson::dom::element e) {
  std::vector<int32_t> ids;
  simdjson::dom::array a;
  if (e.get(a) == simdjson::SUCCESS)
    for (auto x : a) ids.push_back(int32_t(int64_t(x)));
  return ids;
}

void check_matches_schema(std::string_view text) {
  simdjson::dom::parser parser;
  simdjson::dom::element doc;
  REQUIRE_MESSAGE(parser.parse(text.data(), text.size()).get(doc) == simdjson::SUCCESS, text);
  simdjson::dom::object o;
  REQUIRE(doc.get(o) == simdjson::SUCCESS);
  CHECK(o["n"].is_int64());
  CHECK(o["ok"].is_bool());
  std::string_view c;
  REQUIRE(o["c"].get(c) == simdjson::SUCCESS);
  CHECK((c == "red" || c == "green"));
  CHECK(o.size() == 3);
}

}  // namespace

TEST_CASE("serve: response_format json_schema matches generate --json-schema, id for id") {
  TempDir dir;
  const std::string schema = dir / "schema.json";
  std::ofstream(schema) << kSchema;
  const Run gen =
      k3flow("generate " + kTiny +
             " --prompt Hello --gen 300 --print-ids --temperature 1 --seed 11 --json-schema " + schema);
  REQUIRE_MESSAGE(gen.code == 0, gen.err);
  std::vector<int32_t> want;
  {
    std::istringstream in(gen.out.substr(gen.out.rfind("\nids:") + 5));
    for (int32_t id; in >> id;) want.push_back(id);
  }
  ServeChild s(kTiny);
  const std::string body = std::string(R"({"prompt":"Hello","max_tokens":300,"temperature":1,"seed":11,)") +
                           R"("return_token_ids":true,"response_format":{"type":"json_schema",)" +
                           R"("json_schema":{"name":"t","strict":true,"schema":)" + kSchema + "}}}";
  const HttpResponse r = http(s.port(), "POST", "/v1/completions", body);
  REQUIRE_MESSAGE(r.status == 200, r.body);
  simdjson::dom::parser p;
  simdjson::dom::element doc = p.parse(r.body);
  auto choice = doc["choices"].at(0);
  CHECK(ids_of(choice["token_ids"]) == want);
  CHECK(std::string_view(choice["finish_reason"]) == "stop");
  check_matches_schema(std::string_view(choice["text"]));

  SUBCASE("chat json_object: the reply is one JSON object, streamed or not") {
    const std::string chat = R"({"messages":[{"role":"user","content":"Give me JSON"}],"max_tokens":400,)"
                             R"("temperature":0.9,"seed":2,"response_format":{"type":"json_object"})";
    const HttpResponse whole = http(s.port(), "POST", "/v1/chat/completions", chat + "}");
    REQUIRE_MESSAGE(whole.status == 200, whole.body);
    simdjson::dom::parser wp;
    const simdjson::dom::element w = wp.parse(whole.body);
    const std::string content(std::string_view(w["choices"].at(0)["message"]["content"]));
    if (std::string_view(w["choices"].at(0)["finish_reason"]) == "stop") {
      simdjson::dom::parser cp;
      simdjson::dom::element value;
      REQUIRE_MESSAGE(cp.parse(content).get(value) == simdjson::SUCCESS, content);
      CHECK(value.is_object());
    } else {
      CHECK(content.find_first_not_of(" \t\r\n") == content.find('{'));  // cut by max_tokens
    }
    const HttpResponse streamed = http(s.port(), "POST", "/v1/chat/completions", chat + R"(,"stream":true})");
    REQUIRE(streamed.status == 200);
    std::string joined;
    for (const std::string& d : sse_data(streamed.body)) {
      if (d == "[DONE]") break;
      simdjson::dom::parser dp;
      const simdjson::dom::element e = dp.parse(d);
      std::string_view piece;
      if (e["choices"].at(0)["delta"]["content"].get(piece) == simdjson::SUCCESS) joined += piece;
    }
    CHECK(joined == content);
  }
}

TEST_CASE("serve: logprobs are the log-softmax of the logits generate dumps") {
  TempDir dir;
  const std::string logits_file = dir / "logits.f32";
  const Run gen = k3flow("generate " + kTiny + " --prompt Hello --gen 1 --dump-logits " + logits_file);
  REQUIRE_MESSAGE(gen.code == 0, gen.err);
  const std::string raw = slurp(logits_file);
  std::vector<float> logits(raw.size() / 4);
  std::memcpy(logits.data(), raw.data(), logits.size() * 4);
  REQUIRE(logits.size() == 256);
  long double sum = 0;
  for (float x : logits) sum += std::exp(static_cast<long double>(x));
  const auto logprob = [&](size_t id) {
    return double(static_cast<long double>(logits[id]) - std::log(sum));
  };
  std::vector<size_t> order(logits.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return logits[a] > logits[b]; });

  ServeChild s(kTiny);
  SUBCASE("completions, logprobs: 3") {
    const HttpResponse r = http(s.port(), "POST", "/v1/completions",
                                R"({"prompt":"Hello","max_tokens":4,"logprobs":3,"return_token_ids":true})");
    REQUIRE_MESSAGE(r.status == 200, r.body);
    simdjson::dom::parser p;
    const simdjson::dom::element choice = p.parse(r.body)["choices"].at(0);
    const simdjson::dom::element lp = choice["logprobs"];
    const std::vector<int32_t> ids = ids_of(choice["token_ids"]);
    REQUIRE(ids.size() == 4);
    CHECK(size_t(ids[0]) == order[0]);  // greedy
    CHECK(double(lp["token_logprobs"].at(0)) == doctest::Approx(logprob(order[0])).epsilon(1e-9));
    simdjson::dom::object top0 = lp["top_logprobs"].at(0);
    CHECK(top0.size() == 3);
    for (size_t i = 0; i < 3; ++i) {
      const std::string token(1, char(order[i]));
      double v = 0;
      if (order[i] < 0x80 && top0[token].get(v) == simdjson::SUCCESS)  // bytes >= 0x80 show as U+FFFD
        CHECK(v == doctest::Approx(logprob(order[i])).epsilon(1e-9));
    }
    // Offsets advance by each token's bytes (one byte each in this vocabulary).
    std::vector<int64_t> offsets;
    for (auto o : simdjson::dom::array(lp["text_offset"])) offsets.push_back(int64_t(o));
    CHECK(offsets == std::vector<int64_t>{0, 1, 2, 3});
    for (size_t i = 0; i < 4; ++i) {
      // Greedy: the chosen token is the first alternative, with the same value.
      simdjson::dom::object top = lp["top_logprobs"].at(i);
      double best = -1e300;
      for (auto [k, v] : top) best = std::max(best, double(v));
      CHECK(double(lp["token_logprobs"].at(i)) == best);
    }
  }
  SUBCASE("chat, streamed, logprobs with top_logprobs: 2") {
    const HttpResponse r =
        http(s.port(), "POST", "/v1/chat/completions",
             R"({"messages":[{"role":"user","content":"Hello"}],"max_tokens":6,"stream":true,)"
             R"("logprobs":true,"top_logprobs":2,"stream_options":{"include_usage":true}})");
    REQUIRE(r.status == 200);
    size_t tokens = 0;
    int64_t completion_tokens = -1;
    for (const std::string& d : sse_data(r.body)) {
      if (d == "[DONE]") break;
      simdjson::dom::parser p;
      const simdjson::dom::element e = p.parse(d);
      int64_t ct = 0;
      if (e["usage"]["completion_tokens"].get(ct) == simdjson::SUCCESS) completion_tokens = ct;
      simdjson::dom::array choices = e["choices"];
      if (choices.size() == 0) continue;
      simdjson::dom::array content;
      if (choices.at(0)["logprobs"]["content"].get(content) != simdjson::SUCCESS) continue;
      for (auto t : content) {
        ++tokens;
        simdjson::dom::array bytes = t["bytes"];
        CHECK(bytes.size() == 1);
        simdjson::dom::array top = t["top_logprobs"];
        CHECK(top.size() == 2);
        CHECK(double(t["logprob"]) <= 0);
        CHECK(double(top.at(0)["logprob"]) >= double(top.at(1)["logprob"]));
      }
    }
    CHECK(completion_tokens == 6);
    CHECK(tokens == 6);
  }
}

TEST_CASE("serve: the sampling fields refuse bad values by name") {
  ServeChild s(kTiny);
  const auto refused = [&](const std::string& path, const std::string& body, const std::string& says) {
    const HttpResponse r = http(s.port(), "POST", path, body);
    CHECK_MESSAGE(r.status == 400, body << " -> " << r.body);
    CHECK_MESSAGE(r.body.find(says) != std::string::npos, r.body);
  };
  const std::string chat = R"({"messages":[{"role":"user","content":"x"}],)";
  const std::string cmpl = R"({"prompt":"x",)";
  refused("/v1/chat/completions", chat + R"("top_logprobs":2})", "'top_logprobs' needs 'logprobs': true");
  refused("/v1/chat/completions", chat + R"("logprobs":true,"top_logprobs":21})",
          "'top_logprobs' must be in [0, 20]");
  refused("/v1/completions", cmpl + R"("logprobs":true})", "'logprobs' must be an integer");
  refused("/v1/completions", cmpl + R"("presence_penalty":2.5})", "'presence_penalty' must be in [-2, 2]");
  refused("/v1/completions", cmpl + R"("frequency_penalty":"a"})", "'frequency_penalty' must be a number");
  refused("/v1/completions", cmpl + R"("response_format":{"type":"yaml"}})", "'response_format.type' yaml");
  refused("/v1/completions",
          cmpl + R"("response_format":{"type":"json_schema","json_schema":{"schema":)" +
              R"({"type":"string","format":"date"}}}})",
          "'response_format.json_schema.schema': /: 'format' is not supported");
  refused("/v1/completions", cmpl + R"("response_format":{"type":"json_schema","json_schema":{"name":"a"}}})",
          "'response_format.json_schema.schema' is required");
  refused("/v1/completions", cmpl + R"("ignore_eos":true,"response_format":{"type":"json_object"}})",
          "'ignore_eos' and a JSON 'response_format'");
  refused("/v1/chat/completions", chat + R"("thinking":true,"response_format":{"type":"json_object"}})",
          "'thinking': true and a JSON 'response_format'");
}

TEST_CASE("serve: presence / frequency penalties give generate's ids for the same options") {
  const auto generated = [](const std::string& flags) {
    const Run r = k3flow("generate " + kTiny +
                         " --prompt Hello --gen 40 --print-ids --temperature 0.8 --seed 4" + flags);
    REQUIRE_MESSAGE(r.code == 0, r.err);
    std::vector<int32_t> ids;
    std::istringstream in(r.out.substr(r.out.rfind("\nids:") + 5));
    for (int32_t id; in >> id;) ids.push_back(id);
    return ids;
  };
  const std::vector<int32_t> want = generated(" --presence-penalty 1.5 --frequency-penalty -0.5");
  CHECK(generated("") != want);  // the penalties act

  ServeChild s(kTiny);
  const HttpResponse r = http(s.port(), "POST", "/v1/completions",
                              R"({"prompt":"Hello","max_tokens":40,"temperature":0.8,"seed":4,)"
                              R"("presence_penalty":1.5,"frequency_penalty":-0.5,"return_token_ids":true})");
  REQUIRE_MESSAGE(r.status == 200, r.body);
  simdjson::dom::parser p;
  const simdjson::dom::element doc = p.parse(r.body);
  CHECK(ids_of(doc["choices"].at(0)["token_ids"]) == want);
}
