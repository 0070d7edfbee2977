// `k3flow serve` end to end: the real binary as a child on loopback (tests/test_serve_client.hpp),
// on fixtures/tiny-k3 (byte-level tokenizer) resident and streamed, and on a `k3flow synth`
// checkpoint streamed within a budget. Greedy text and ids equal `k3flow generate`'s for the same
// prompt, streamed or not, alone or beside other requests; the error statuses; 429 from a full queue,
// none with --queue 0 while a slot is free;
// a disconnect frees the slot; /health 503 while loading; /metrics parses and moves; SIGTERM and
// SIGINT exit 0, a request in flight finishing inside the drain bound; 503 beyond --max-connections;
// flag errors exit 2; curl -N reads a stream.
#include <doctest/doctest.h>
#include <fmt/format.h>
#include <simdjson.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/run_helpers.hpp"
#include "tests/test_serve_client.hpp"

using namespace k3::test;

namespace {

const std::string kTiny = std::string(K3_FIXTURES) + "/tiny-k3";

struct Gen {
  std::string text;
  std::vector<int32_t> ids;
};

std::vector<int32_t> parse_ids(const std::string& s) {
  std::vector<int32_t> ids;
  std::istringstream in(s);
  int32_t id;
  while (in >> id) ids.push_back(id);
  return ids;
}

// `k3flow generate MODEL --prompt P --gen N --print-ids FLAGS`: the continuation and its ids.
Gen generate(const std::string& model, const std::string& prompt, int gen, const std::string& flags = "") {
  const Run r = k3flow_sh(fmt::format("generate {} --prompt '{}' --gen {} --print-ids --no-progress {}",
                                      model, prompt, gen, flags),
                          "", 300);
  REQUIRE_MESSAGE(r.code == 0, r.err);
  const size_t at = r.out.rfind("\nids:");
  REQUIRE(at != std::string::npos);
  return Gen{r.out.substr(0, at), parse_ids(r.out.substr(at + 5))};
}

std::string completion_body(const std::string& prompt, int max_tokens, bool stream,
                            const std::string& extra = "") {
  return fmt::format(
      R"({{"model":"tiny-k3","prompt":"{}","max_tokens":{},"stream":{},"return_token_ids":true{}}})", prompt,
      max_tokens, stream ? "true" : "false", extra);
}

struct Json {
  simdjson::dom::parser parser;
  simdjson::dom::element doc;
  explicit Json(const std::string& s) {
    const auto err = parser.parse(s).get(doc);
    REQUIRE_MESSAGE(!err, "not JSON: " << s);
  }
};

std::vector<int32_t> ids_of(simdjson::simdjson_result<simdjson::dom::element> e) {
  std::vector<int32_t> out;
  simdjson::dom::array a;
  if (e.get(a)) return out;
  for (auto x : a) out.push_back(int32_t(int64_t(x)));
  return out;
}

// A non-streamed completion: text, ids, finish_reason, usage.
struct Completion {
  int status = 0;
  std::string text, finish;
  std::vector<int32_t> ids;
  int64_t prompt_tokens = -1, completion_tokens = -1, total_tokens = -1;
};

Completion parse_completion(const HttpResponse& r) {
  Completion c;
  c.status = r.status;
  if (r.status != 200) return c;
  Json j(r.body);
  auto ch = j.doc["choices"].at(0);
  c.text = std::string(std::string_view(ch["text"]));
  c.finish = std::string(std::string_view(ch["finish_reason"]));
  c.ids = ids_of(ch["token_ids"]);
  c.prompt_tokens = int64_t(j.doc["usage"]["prompt_tokens"]);
  c.completion_tokens = int64_t(j.doc["usage"]["completion_tokens"]);
  c.total_tokens = int64_t(j.doc["usage"]["total_tokens"]);
  CHECK(std::string_view(j.doc["object"]) == "text_completion");
  return c;
}

// A streamed completion reassembled from its chunks.
Completion parse_stream(const HttpResponse& r) {
  Completion c;
  c.status = r.status;
  if (r.status != 200) return c;
  CHECK(r.headers.at("content-type") == "text/event-stream");
  const std::vector<std::string> events = sse_data(r.body);
  REQUIRE(!events.empty());
  CHECK(events.back() == "[DONE]");
  for (size_t i = 0; i + 1 < events.size(); ++i) {
    Json j(events[i]);
    simdjson::dom::array choices = j.doc["choices"];
    if (choices.size() == 0) {  // the usage chunk
      c.prompt_tokens = int64_t(j.doc["usage"]["prompt_tokens"]);
      c.completion_tokens = int64_t(j.doc["usage"]["completion_tokens"]);
      c.total_tokens = int64_t(j.doc["usage"]["total_tokens"]);
      continue;
    }
    auto ch = choices.at(0);
    c.text += std::string_view(ch["text"]);
    const std::vector<int32_t> ids = ids_of(ch["token_ids"]);
    c.ids.insert(c.ids.end(), ids.begin(), ids.end());
    std::string_view fr;
    if (ch["finish_reason"].get(fr) == simdjson::SUCCESS) c.finish = std::string(fr);
  }
  return c;
}

std::map<std::string, double> metric_values(const std::string& text) {
  std::map<std::string, double> v;
  std::set<std::string> typed;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("# TYPE ", 0) == 0) {
      std::istringstream l(line.substr(7));
      std::string name, type;
      l >> name >> type;
      CHECK((type == "counter" || type == "gauge"));
      typed.insert(name);
      continue;
    }
    if (line.empty() || line[0] == '#') continue;
    const size_t sp = line.rfind(' ');
    REQUIRE(sp != std::string::npos);
    const std::string key = line.substr(0, sp);
    char* end = nullptr;
    const double x = std::strtod(line.c_str() + sp + 1, &end);
    CHECK_MESSAGE(*end == 0, line);
    v[key] = x;
    CHECK_MESSAGE(typed.count(key.substr(0, key.find('{'))) == 1, "no # TYPE for " << key);
  }
  return v;
}

}  // namespace

TEST_CASE("tiny model: greedy completions equal generate's, streamed or not, alone or concurrent") {
  const std::vector<std::string> prompts = {"Hello", "The quick brown fox", "k3flow serves", "a b c d e f g"};
  std::vector<Gen> want;
  for (const std::string& p : prompts) want.push_back(generate(kTiny, p, 24));
  ServeChild s(kTiny + " --max-seqs 3 --queue 8");

  SUBCASE("alone, not streamed and streamed") {
    for (size_t i = 0; i < prompts.size(); ++i) {
      CAPTURE(prompts[i]);
      const Completion c =
          parse_completion(http(s.port(), "POST", "/v1/completions", completion_body(prompts[i], 24, false)));
      REQUIRE(c.status == 200);
      CHECK(c.ids == want[i].ids);
      CHECK(c.text == want[i].text);
      CHECK(c.finish == "length");
      CHECK(c.completion_tokens == 24);
      CHECK(c.total_tokens == c.prompt_tokens + 24);
      const Completion st = parse_stream(
          http(s.port(), "POST", "/v1/completions",
               completion_body(prompts[i], 24, true, R"(,"stream_options":{"include_usage":true})")));
      REQUIRE(st.status == 200);
      CHECK(st.ids == want[i].ids);
      CHECK(st.text == want[i].text);
      CHECK(st.finish == "length");
      CHECK(st.completion_tokens == 24);
      CHECK(st.prompt_tokens == c.prompt_tokens);
    }
  }
  SUBCASE("concurrent: more requests than slots, streamed and not") {
    std::vector<Completion> got(prompts.size() * 2);
    std::vector<std::thread> clients;
    for (size_t i = 0; i < got.size(); ++i)
      clients.emplace_back([&, i] {
        const bool stream = i % 2 == 1;
        const HttpResponse r =
            http(s.port(), "POST", "/v1/completions", completion_body(prompts[i / 2], 24, stream));
        got[i] = stream ? parse_stream(r) : parse_completion(r);
      });
    for (std::thread& t : clients) t.join();
    for (size_t i = 0; i < got.size(); ++i) {
      CAPTURE(i);
      CHECK(got[i].status == 200);
      CHECK(got[i].ids == want[i / 2].ids);
      CHECK(got[i].text == want[i / 2].text);
    }
  }
  CHECK(s.stop(SIGTERM) == 0);
}

TEST_CASE("seeded sampling and stop strings match generate's") {
  const Gen want = generate(kTiny, "Hello", 30, "--temperature 0.9 --top-p 0.95 --seed 42");
  ServeChild s(kTiny);
  const Completion c = parse_completion(
      http(s.port(), "POST", "/v1/completions",
           completion_body("Hello", 30, false, R"(,"temperature":0.9,"top_p":0.95,"seed":42)")));
  CHECK(c.ids == want.ids);
  CHECK(c.text == want.text);
  // A stop string taken from the middle of the greedy text: generate --stop and serve stop alike.
  const Gen greedy = generate(kTiny, "Hello", 30);
  std::string stop;
  for (size_t at = 6; at + 2 <= greedy.text.size() && stop.empty(); ++at) {
    const std::string cand = greedy.text.substr(at, 2);
    if (cand.find_first_of("\"\\'\n\r\t") == std::string::npos &&
        static_cast<unsigned char>(cand[0]) >= 0x20 && static_cast<unsigned char>(cand[0]) < 0x7f &&
        static_cast<unsigned char>(cand[1]) >= 0x20 && static_cast<unsigned char>(cand[1]) < 0x7f)
      stop = cand;
  }
  REQUIRE(!stop.empty());
  const Gen want_stop = generate(kTiny, "Hello", 30, fmt::format("--stop '{}'", stop));
  const Completion cs =
      parse_completion(http(s.port(), "POST", "/v1/completions",
                            completion_body("Hello", 30, false, fmt::format(R"(,"stop":["{}"])", stop))));
  CHECK(cs.finish == "stop");
  CHECK(cs.text == want_stop.text);
  CHECK(cs.ids == want_stop.ids);
}

TEST_CASE("chat completions: the XTML render, the reply parsed, streamed equals not streamed") {
  ServeChild s(kTiny + " --model-name k3");
  const std::string body =
      R"({"model":"k3","messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"Hi"}],"max_tokens":12)";
  for (const char* thinking : {"true", "false"}) {
    CAPTURE(thinking);
    const std::string b = fmt::format(R"({},"thinking":{})", body, thinking);
    const HttpResponse r = http(s.port(), "POST", "/v1/chat/completions", b + "}");
    REQUIRE(r.status == 200);
    Json j(r.body);
    CHECK(std::string_view(j.doc["object"]) == "chat.completion");
    auto msg = j.doc["choices"].at(0)["message"];
    CHECK(std::string_view(msg["role"]) == "assistant");
    const std::string content{std::string_view(msg["content"])};
    std::string reasoning;
    std::string_view rv;
    if (msg["reasoning_content"].get(rv) == simdjson::SUCCESS) reasoning = rv;
    CHECK(int64_t(j.doc["usage"]["completion_tokens"]) == 12);
    // The byte-level model writes noise: with thinking on, it is all think channel.
    if (std::string(thinking) == "true") CHECK(content.empty());
    CHECK(content.size() + reasoning.size() > 0);

    const HttpResponse rs = http(s.port(), "POST", "/v1/chat/completions", b + R"(,"stream":true})");
    REQUIRE(rs.status == 200);
    std::string scontent, sreasoning, finish;
    const std::vector<std::string> ev = sse_data(rs.body);
    REQUIRE(ev.size() >= 2);
    CHECK(ev.back() == "[DONE]");
    for (size_t i = 0; i + 1 < ev.size(); ++i) {
      Json e(ev[i]);
      CHECK(std::string_view(e.doc["object"]) == "chat.completion.chunk");
      auto ch = e.doc["choices"].at(0);
      std::string_view x;
      if (i == 0) CHECK(std::string_view(ch["delta"]["role"]) == "assistant");
      if (ch["delta"]["content"].get(x) == simdjson::SUCCESS) scontent += x;
      if (ch["delta"]["reasoning_content"].get(x) == simdjson::SUCCESS) sreasoning += x;
      if (ch["finish_reason"].get(x) == simdjson::SUCCESS) finish = x;
    }
    CHECK(scontent == content);
    CHECK(sreasoning == reasoning);
    CHECK(finish == "length");
  }
}

TEST_CASE("bad requests get their status and an OpenAI error body; the server keeps serving") {
  ServeChild s(kTiny + " --max-body-kb 1 --api-key sekrit");
  const std::vector<std::string> auth = {"Authorization: Bearer sekrit"};
  const auto expect = [&](int status, const std::string& method, const std::string& path,
                          const std::string& body, const std::string& type,
                          const std::vector<std::string>& headers) {
    CAPTURE(path);
    CAPTURE(body.substr(0, 80));
    const HttpResponse r = http(s.port(), method, path, body, headers);
    CHECK(r.status == status);
    Json j(r.body);
    CHECK(std::string_view(j.doc["error"]["type"]) == type);
    CHECK(!std::string_view(j.doc["error"]["message"]).empty());
    return std::string(std::string_view(j.doc["error"]["message"]));
  };
  const std::string good = completion_body("Hi", 3, false);
  expect(401, "POST", "/v1/completions", good, "authentication_error", {});
  expect(401, "POST", "/v1/completions", good, "authentication_error", {"Authorization: Bearer wrong"});
  expect(401, "GET", "/metrics", "", "authentication_error", {});
  CHECK(http(s.port(), "GET", "/health").status == 200);  // open without the key
  expect(400, "POST", "/v1/completions", "{\"prompt\": ", "invalid_request_error", auth);
  expect(400, "POST", "/v1/completions", "[1,2]", "invalid_request_error", auth);
  CHECK(expect(400, "POST", "/v1/completions", R"({"prompt":"Hi","max_tokens":"5"})", "invalid_request_error",
               auth)
            .find("max_tokens") != std::string::npos);
  CHECK(expect(400, "POST", "/v1/completions", R"({"prompt":"Hi","temperature":"hot"})",
               "invalid_request_error", auth)
            .find("temperature") != std::string::npos);
  CHECK(expect(400, "POST", "/v1/completions", R"({"prompt":"Hi","stop":[1]})", "invalid_request_error", auth)
            .find("stop") != std::string::npos);
  CHECK(expect(400, "POST", "/v1/completions", R"({"max_tokens":3})", "invalid_request_error", auth)
            .find("prompt") != std::string::npos);
  CHECK(expect(400, "POST", "/v1/chat/completions", R"({"max_tokens":3})", "invalid_request_error", auth)
            .find("messages") != std::string::npos);
  CHECK(expect(400, "POST", "/v1/chat/completions", R"({"messages":[{"role":"robot","content":"x"}]})",
               "invalid_request_error", auth)
            .find("role") != std::string::npos);
  expect(400, "POST", "/v1/chat/completions", R"({"messages":[{"role":"assistant","content":"x"}]})",
         "invalid_request_error", auth);
  expect(400, "POST", "/v1/completions", R"({"prompt":"Hi","max_tokens":0})", "invalid_request_error", auth);
  CHECK(expect(404, "POST", "/v1/completions", R"({"model":"gpt-4","prompt":"Hi"})", "invalid_request_error",
               auth)
            .find("gpt-4") != std::string::npos);
  expect(413, "POST", "/v1/completions", fmt::format(R"({{"prompt":"{}"}})", std::string(2000, 'x')),
         "invalid_request_error", auth);
  expect(404, "GET", "/v2/nothing", "", "not_found_error", auth);
  expect(405, "GET", "/v1/completions", "", "invalid_request_error", auth);
  // Still serving, and the key lets it through.
  CHECK(parse_completion(http(s.port(), "POST", "/v1/completions", good, auth)).status == 200);
  const HttpResponse models = http(s.port(), "GET", "/v1/models", "", auth);
  REQUIRE(models.status == 200);
  Json m(models.body);
  CHECK(std::string_view(m.doc["data"].at(0)["id"]) == "tiny-k3");
  CHECK(s.stop(SIGINT) == 0);
}

TEST_CASE("a full queue answers 429 at once; a client that disconnects frees its slot") {
  // Streamed at the floor with a slow step, so one long request holds the only slot for a while.
  ServeChild s(kTiny + " --preset ultra --max-seqs 1 --queue 1", "K3FLOW_TEST_STEP_DELAY_MS=20");
  // A: a long streamed request, read until its first chunk.
  const int a = connect_loopback(s.port());
  REQUIRE(a >= 0);
  REQUIRE(send_all(a, request_text("POST", "/v1/completions", completion_body("Hello", 3000, true), {})));
  char buf[4096];
  REQUIRE(::recv(a, buf, sizeof buf, 0) > 0);
  // The stream's headers go out when A is queued, not when it is admitted: wait until A holds the
  // slot (else B could find A still in the one-place queue and be the one refused).
  bool admitted = false;
  for (int i = 0; i < 3000 && !admitted; ++i) {
    Json h(http(s.port(), "GET", "/health").body);
    admitted = int64_t(h.doc["active"]) == 1 && int64_t(h.doc["queued"]) == 0;
    if (!admitted) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  REQUIRE(admitted);
  // B waits in the queue (its response is read later); C finds the queue full.
  const int b = connect_loopback(s.port());
  REQUIRE(b >= 0);
  REQUIRE(send_all(b, request_text("POST", "/v1/completions", completion_body("Hi", 4, false), {})));
  // The waits below are bounded at 30 s: under a loaded full suite (or a sanitizer) a request can
  // take seconds to reach the queue, and a missed wait shows up later as a wrong status.
  bool queued = false;
  for (int i = 0; i < 3000 && !queued; ++i) {
    Json h(http(s.port(), "GET", "/health").body);
    queued = int64_t(h.doc["queued"]) == 1;
    if (!queued) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  REQUIRE(queued);
  const auto t0 = std::chrono::steady_clock::now();
  const HttpResponse c = http(s.port(), "POST", "/v1/completions", completion_body("Hey", 4, false));
  CHECK(c.status == 429);
  CHECK(c.headers.at("retry-after") == "1");
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(10));  // at once, not after A
  Json cj(c.body);
  CHECK(std::string_view(cj.doc["error"]["type"]) == "rate_limit_error");
  // A hangs up: its sequence leaves at the next step and B gets the slot and finishes.
  ::close(a);
  std::string raw;
  for (;;) {
    const ssize_t n = ::recv(b, buf, sizeof buf, 0);
    if (n <= 0) break;
    raw.append(buf, size_t(n));
  }
  ::close(b);
  const Completion got = parse_completion(parse_response(raw));
  CHECK(got.status == 200);
  CHECK(got.completion_tokens == 4);
  // B's last bytes can reach us just before the scheduler retires its sequence (seen once in a
  // loaded full suite): the slot is free within the same bounded wait as above.
  int64_t b_active = -1;
  for (int i = 0; i < 3000 && b_active != 0; ++i) {
    Json h(http(s.port(), "GET", "/health").body);
    b_active = int64_t(h.doc["active"]);
    if (b_active != 0) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  CHECK(b_active == 0);
  const std::map<std::string, double> m = metric_values(http(s.port(), "GET", "/metrics").body);
  CHECK(m.at("k3flow_generated_tokens_total") < 3000);  // A was cut short
  CHECK(m.at(R"(k3flow_requests_total{endpoint="/v1/completions",status="429"})") == 1);
  // A non-streamed request writes nothing until its end: its hang-up is noticed all the same.
  const int d = connect_loopback(s.port());
  REQUIRE(send_all(d, request_text("POST", "/v1/completions", completion_body("Hello", 3000, false), {})));
  const auto active = [&] { return int64_t(Json(http(s.port(), "GET", "/health").body).doc["active"]); };
  for (int i = 0; i < 3000 && active() == 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  ::close(d);
  int64_t left = 1;
  for (int i = 0; i < 3000 && left != 0; ++i) {
    left = active();
    if (left) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  CHECK(left == 0);
  const std::map<std::string, double> m2 = metric_values(http(s.port(), "GET", "/metrics").body);
  CHECK(m2.at("k3flow_generated_tokens_total") < m.at("k3flow_generated_tokens_total") + 3000);
  CHECK(s.stop(SIGTERM) == 0);
}

TEST_CASE("--queue 0: a request is served while a slot is free; --queue bounds only the waiting ones") {
  ServeChild s(kTiny + " --max-seqs 1 --queue 0");
  for (const char* prompt : {"Hello", "Hi"}) {  // the second after the first freed the slot
    CAPTURE(prompt);
    const Completion got =
        parse_completion(http(s.port(), "POST", "/v1/completions", completion_body(prompt, 3, false)));
    CHECK(got.status == 200);
    CHECK(got.completion_tokens == 3);
  }
  const std::map<std::string, double> m = metric_values(http(s.port(), "GET", "/metrics").body);
  const auto refused = m.find(R"(k3flow_requests_total{endpoint="/v1/completions",status="429"})");
  CHECK((refused == m.end() || refused->second == 0));
  CHECK(s.stop(SIGTERM) == 0);
}

TEST_CASE("/health answers 503 with the load's progress until the model is in; then 200") {
  ServeChild s(kTiny, "K3FLOW_TEST_LOAD_DELAY_MS=1500", /*wait_ready=*/false);
  const HttpResponse h = http(s.port(), "GET", "/health");
  CHECK(h.status == 503);
  Json j(h.body);
  CHECK(std::string_view(j.doc["status"]) == "loading");
  CHECK(int64_t(j.doc["checkpoint_bytes"]) >= 0);
  CHECK(http(s.port(), "POST", "/v1/completions", completion_body("Hi", 2, false)).status == 503);
  CHECK(metric_values(http(s.port(), "GET", "/metrics").body).at("k3flow_ready") == 0);
  int status = 0;
  for (int i = 0; i < 3000 && status != 200; ++i) {
    status = http(s.port(), "GET", "/health").status;
    if (status != 200) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  CHECK(status == 200);
  CHECK(s.stop(SIGTERM) == 0);
}

TEST_CASE("/metrics: Prometheus text whose counters move with a request") {
  ServeChild s(kTiny);
  const HttpResponse r0 = http(s.port(), "GET", "/metrics");
  REQUIRE(r0.status == 200);
  CHECK(r0.headers.at("content-type").rfind("text/plain; version=0.0.4", 0) == 0);
  const std::map<std::string, double> m0 = metric_values(r0.body);
  for (const char* name : {"k3flow_ready", "k3flow_generated_tokens_total", "k3flow_prompt_tokens_total",
                           "k3flow_decode_steps_total", "k3flow_seconds_per_token", "k3flow_queue_depth",
                           "k3flow_active_sequences", "k3flow_resident_memory_bytes"})
    CHECK_MESSAGE(m0.count(name) == 1, name);
  CHECK(m0.at("k3flow_ready") == 1);
  CHECK(m0.at("k3flow_resident_memory_bytes") > 0);
  // A resident model reads nothing while serving: the streamed model's read families are absent.
  for (const char* name :
       {"k3flow_stream_bytes_read_total", "k3flow_trunk_bytes_read_total", "k3flow_expert_bytes_read_total",
        "k3flow_expert_hits_total", "k3flow_expert_misses_total", "k3flow_overlap_efficiency"})
    CHECK_MESSAGE(m0.count(name) == 0, name);
  REQUIRE(http(s.port(), "POST", "/v1/completions", completion_body("Hello", 7, false)).status == 200);
  const std::map<std::string, double> m1 = metric_values(http(s.port(), "GET", "/metrics").body);
  CHECK(m1.at("k3flow_generated_tokens_total") == m0.at("k3flow_generated_tokens_total") + 7);
  CHECK(m1.at("k3flow_prompt_tokens_total") == m0.at("k3flow_prompt_tokens_total") + 5);
  CHECK(m1.at("k3flow_decode_steps_total") == m0.at("k3flow_decode_steps_total") + 7);
  CHECK(m1.at(R"(k3flow_requests_total{endpoint="/v1/completions",status="200"})") == 1);
  CHECK(m1.at("k3flow_seconds_per_token") > 0);
}

TEST_CASE("SIGTERM during a stream: the request ends within the drain bound and serve exits 0") {
  ServeChild s(kTiny + " --preset ultra --drain-seconds 0.5", "K3FLOW_TEST_STEP_DELAY_MS=20");
  const int a = connect_loopback(s.port());
  REQUIRE(send_all(a, request_text("POST", "/v1/completions", completion_body("Hello", 3000, true), {})));
  char buf[4096];
  std::string raw;
  const ssize_t n0 = ::recv(a, buf, sizeof buf, 0);
  REQUIRE(n0 > 0);
  raw.append(buf, size_t(n0));
  CHECK(s.stop(SIGTERM) == 0);
  for (;;) {
    const ssize_t n = ::recv(a, buf, sizeof buf, 0);
    if (n <= 0) break;
    raw.append(buf, size_t(n));
  }
  ::close(a);
  const std::vector<std::string> ev = sse_data(parse_response(raw).body);
  REQUIRE(!ev.empty());
  CHECK(ev.back() == "[DONE]");  // the stream was closed properly, with an error event before it
  CHECK(ev.size() >= 2);
  CHECK(ev[ev.size() - 2].find("\"error\"") != std::string::npos);
}

TEST_CASE("SIGTERM drains: a request in flight finishes and serve exits 0; --max-connections answers 503") {
  ServeChild s(kTiny + " --preset ultra --max-connections 2 --drain-seconds 60",
               "K3FLOW_TEST_STEP_DELAY_MS=20");
  const int idle = connect_loopback(s.port());
  REQUIRE(idle >= 0);
  // A: a streamed request, read until its first bytes. The session of the readiness poll's last
  // /health may not have counted itself out yet (it closes the socket first): A is then refused
  // with 503 and tried again.
  char buf[4096];
  std::string raw;
  int a = -1;
  for (int attempt = 0; attempt < 100 && a < 0; ++attempt) {
    a = connect_loopback(s.port());
    REQUIRE(a >= 0);
    REQUIRE(send_all(a, request_text("POST", "/v1/completions", completion_body("Hello", 40, true), {})));
    const ssize_t n0 = ::recv(a, buf, sizeof buf, 0);
    raw.assign(buf, size_t(std::max<ssize_t>(n0, 0)));
    // (refused before it read the request, the connection may end in a reset instead)
    if (n0 <= 0 || raw.rfind("HTTP/1.1 503", 0) == 0) {
      ::close(a);
      a = -1;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }
  REQUIRE(a >= 0);
  // Two connections are open (accepted in order, so `idle` too): a third is answered 503 at once,
  // before it sends anything.
  const int c = connect_loopback(s.port());
  REQUIRE(c >= 0);
  std::string refused;
  for (ssize_t n; (n = ::recv(c, buf, sizeof buf, 0)) > 0;) refused.append(buf, size_t(n));
  ::close(c);
  const HttpResponse busy = parse_response(refused);
  CHECK(busy.status == 503);
  CHECK(std::string_view(Json(busy.body).doc["error"]["type"]) == "server_error");
  ::close(idle);
  // SIGTERM while A streams: A runs to its max_tokens inside the drain bound, then serve exits 0.
  CHECK(s.stop(SIGTERM) == 0);
  for (ssize_t n; (n = ::recv(a, buf, sizeof buf, 0)) > 0;) raw.append(buf, size_t(n));
  ::close(a);
  const Completion got = parse_stream(parse_response(raw));
  CHECK(got.status == 200);
  CHECK(got.finish == "length");
  CHECK(got.ids.size() == 40);
}

TEST_CASE("flag errors exit 2 with one line") {
  for (const char* args :
       {"serve fixtures-that-do-not-exist", "serve FIX --port 70000", "serve FIX --max-seqs 0",
        "serve FIX --host not-an-address --port 0", "serve FIX --strategy serial", "serve FIX --bogus",
        "serve FIX --prefill both", "serve FIX --prefill-chunk -1"}) {
    std::string a = args;
    if (const size_t at = a.find("FIX"); at != std::string::npos) a.replace(at, 3, kTiny);
    CAPTURE(a);
    const Run r = k3flow(a, "", 60);
    CHECK(r.code == 2);
    CHECK(r.err.rfind("k3flow: ", 0) == 0);
    CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
  }
}

TEST_CASE(
    "a synthetic checkpoint streamed within a budget (prefill separate, chunked): greedy ids equal "
    "generate's") {
  TempDir d;
  const std::string model = d / "m";
  const Run sy = k3flow(fmt::format("synth {} --size tiny --layers 8 --shards 3 --seed 4", model));
  REQUIRE_MESSAGE(sy.code == 0, sy.err);
  const Gen want = generate(model, "Hello world", 6, "--mem-gb 0.02");
  const Gen want2 = generate(model, "Streaming serves", 6, "--mem-gb 0.02");
  // A joining prompt in a step of its own, 3 ids a step: the same ids (inline is the other tests').
  ServeChild s(model + " --mem-gb 0.02 --context 64 --max-seqs 2 --prefill separate --prefill-chunk 3");
  Completion got[2];
  std::thread t([&] {
    got[1] = parse_stream(
        http(s.port(), "POST", "/v1/completions",
             R"({"prompt":"Streaming serves","max_tokens":6,"stream":true,"return_token_ids":true})"));
  });
  got[0] = parse_completion(http(s.port(), "POST", "/v1/completions",
                                 R"({"prompt":"Hello world","max_tokens":6,"return_token_ids":true})"));
  t.join();
  CHECK(got[0].ids == want.ids);
  CHECK(got[0].text == want.text);
  CHECK(got[1].ids == want2.ids);
  CHECK(got[1].text == want2.text);
  // The streamed model's reads, split trunk / experts, the expert cache and the overlap.
  const std::map<std::string, double> m = metric_values(http(s.port(), "GET", "/metrics").body);
  CHECK(m.at("k3flow_stream_bytes_read_total") > 0);
  CHECK(m.at("k3flow_trunk_bytes_read_total") > 0);
  CHECK(m.at("k3flow_expert_bytes_read_total") > 0);
  CHECK(m.at("k3flow_trunk_bytes_read_total") + m.at("k3flow_expert_bytes_read_total") ==
        m.at("k3flow_stream_bytes_read_total"));
  CHECK(m.at("k3flow_expert_misses_total") > 0);  // the first uses of an expert are always read
  CHECK(m.count("k3flow_expert_hits_total") == 1);
  CHECK(m.at("k3flow_io_busy_seconds_total") > 0);
  CHECK(m.at("k3flow_compute_busy_seconds_total") > 0);
  CHECK(m.at("k3flow_overlap_efficiency") > 0);
  CHECK(s.stop(SIGTERM) == 0);
}

TEST_CASE("curl -N reads a streamed chat completion as Server-Sent Events") {
  if (shell("command -v curl").code != 0) {
    MESSAGE("skipped: curl is not installed");
    return;
  }
  ServeChild s(kTiny);
  const Run r = shell(
      fmt::format(
          R"(curl -sSN --max-time 60 http://127.0.0.1:{}/v1/chat/completions -H 'Content-Type: application/json' -d '{{"messages":[{{"role":"user","content":"Hi"}}],"max_tokens":8,"stream":true,"thinking":false}}')",
          s.port()),
      120);
  REQUIRE_MESSAGE(r.code == 0, r.err);
  const std::vector<std::string> ev = sse_data(r.out);
  REQUIRE(ev.size() >= 2);
  CHECK(ev.back() == "[DONE]");
  CHECK(ev.front().find("\"role\":\"assistant\"") != std::string::npos);
  CHECK(ev[ev.size() - 2].find("\"finish_reason\":\"length\"") != std::string::npos);
}
