// `k3flow serve` on the wire, the real binary on loopback (tests/test_serve_client.hpp) with
// fixtures/tiny-k3: silent and trickling sockets are timed out (--idle-seconds, --read-seconds), and
// a client that stops reading its stream is cut (--write-seconds), so they cannot lock a real client
// out of --max-connections; an idle keep-alive is closed; the
// headers a client acts on (Retry-After, WWW-Authenticate, CORS); GET /v1/models/{id}; the start-up
// order (a port in use, a budget below the floor, an unknown preset and a truncated shard end the
// command before "listening"; a load that fails ends the server at once); the load's lines on
// stderr as they happen; the shutdown line.
#include <doctest/doctest.h>
#include <fmt/format.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <simdjson.h>

#include <cerrno>
#include <chrono>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "tests/run_helpers.hpp"
#include "tests/test_serve_client.hpp"

using namespace k3::test;
using Clock = std::chrono::steady_clock;

namespace {

const std::string kTiny = std::string(K3_FIXTURES) + "/tiny-k3";

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Everything the server sends on `fd` until it closes the connection (or `timeout_s` passes).
std::string read_until_closed(int fd, int timeout_s = 20) {
  std::string raw;
  char buf[4096];
  const auto until = Clock::now() + std::chrono::seconds(timeout_s);
  while (Clock::now() < until) {
    pollfd p{.fd = fd, .events = POLLIN, .revents = 0};
    if (::poll(&p, 1, 100) <= 0) continue;
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    raw.append(buf, size_t(n));
  }
  return raw;
}

std::string error_type(const HttpResponse& r) {
  simdjson::dom::parser p;
  simdjson::dom::element doc;
  if (p.parse(r.body).get(doc)) return "not JSON: " + r.body;
  std::string_view t;
  if (doc["error"]["type"].get(t)) return "no error.type: " + r.body;
  return std::string(t);
}

// A response header's value ("" when absent).
std::string header(const HttpResponse& r, const std::string& name) {
  const auto it = r.headers.find(name);
  return it == r.headers.end() ? "" : it->second;
}

const std::string kCompletion = R"({"prompt":"Hello","max_tokens":4})";

// One response on a keep-alive connection: its head, then Content-Length bytes.
HttpResponse read_one(int fd) {
  std::string raw;
  char buf[4096];
  size_t want = std::string::npos;
  while (raw.size() != want) {
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    REQUIRE(n > 0);
    raw.append(buf, size_t(n));
    if (const size_t head = raw.find("\r\n\r\n"); head != std::string::npos && want == std::string::npos)
      want = head + 4 + size_t(std::stoul(parse_response(raw).headers.at("content-length")));
  }
  return parse_response(raw);
}

// A request on a keep-alive connection, and its response.
HttpResponse keep_alive(int fd, const std::string& method, const std::string& path,
                        const std::string& body = "") {
  std::string r = method + " " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\n";
  if (method == "POST")
    r += "Content-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) + "\r\n";
  REQUIRE(send_all(fd, r + "\r\n" + body));
  return read_one(fd);
}

// A Prometheus sample's value in a /metrics body (-1 when absent).
double sample(const std::string& metrics, const std::string& name) {
  const size_t at = metrics.find("\n" + name + " ");
  return at == std::string::npos ? -1 : std::atof(metrics.c_str() + at + name.size() + 2);
}

}  // namespace

TEST_CASE("slowloris: more silent and trickling sockets than --max-connections; a real request completes") {
  ServeChild s(kTiny + " --max-connections 3 --idle-seconds 1 --read-seconds 1");
  // The readiness poll's last connection counts itself out just after its answer.
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const auto t0 = Clock::now();
  // Accepted in this order, the first three take the slots: one that trickles a header byte every
  // 100 ms (a per-read timeout would never fire on it), one that sends half a request and stops,
  // one that never sends a byte. Two more of the last two kinds are refused 503 at once.
  std::vector<int> fds;
  for (int i = 0; i < 5; ++i) {
    fds.push_back(connect_loopback(s.port()));
    REQUIRE(fds.back() >= 0);
    if (i == 1 || i == 3)
      REQUIRE(send_all(fds.back(), "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"));
  }
  std::atomic<bool> trickling{true};
  std::thread dripper([&] {
    const std::string line = "X-Slow: " + std::string(200, 'a');
    for (size_t i = 0; i < line.size() && trickling; ++i) {
      if (!send_all(fds[0], line.substr(i, 1))) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  });
  // A real client retries its 503s (as the openai package does, after Retry-After) and is served
  // once the timeouts have freed the slots.
  HttpResponse got;
  int refusals = 0;
  while (seconds_since(t0) < 20) {
    got = http(s.port(), "POST", "/v1/completions", kCompletion);
    if (got.status != 503) break;
    ++refusals;
    CHECK(header(got, "retry-after") == "1");
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  const double served_after = seconds_since(t0);
  CHECK(got.status == 200);
  CHECK(refusals > 0);  // the silent sockets did hold every slot
  // The slots are held about --idle-seconds / --read-seconds: well under 10 s even on a loaded host.
  CHECK(served_after < 10);
  MESSAGE("served after " << served_after << " s and " << refusals << " refusals");
  std::vector<HttpResponse> answers;
  for (int fd : fds) answers.push_back(parse_response(read_until_closed(fd)));
  trickling = false;
  dripper.join();
  for (int fd : fds) ::close(fd);
  CHECK(answers[0].status == 408);  // the trickler: its request did not arrive within --read-seconds
  CHECK(answers[0].body.find("--read-seconds") != std::string::npos);
  CHECK(answers[1].status == 408);  // half a request
  CHECK(answers[2].status == 0);    // silent: closed without a word, as an idle keep-alive is
  CHECK(answers[3].status == 503);  // over --max-connections
  CHECK(answers[4].status == 503);
  CHECK(header(answers[4], "retry-after") == "1");
  CHECK(s.stop(SIGTERM) == 0);
}

TEST_CASE("a client that stops reading its stream is cut after --write-seconds; its slot serves again") {
  ServeChild s(kTiny + " --max-connections 2 --write-seconds 1 --context 8192 --max-reply 8192");
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the readiness poll's slot is free
  // The stuck client: a small receive window and a small MSS (both set before connect: they are
  // fixed at the handshake; the server sizes its send buffer from the MSS, else it grows towards
  // tcp_wmem's 4 MiB on loopback) and a stream of the largest events the API makes (chat,
  // top_logprobs 20: about 1.5 KB a token), so that a write blocks within a second. Without the
  // small MSS it still does, after some 3 s of decoding. It never reads.
  const int stuck = ::socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(stuck >= 0);
  const int small = 4096, mss = 536;
  ::setsockopt(stuck, SOL_SOCKET, SO_RCVBUF, &small, sizeof small);
  ::setsockopt(stuck, IPPROTO_TCP, TCP_MAXSEG, &mss, sizeof mss);
  timeval tv{.tv_sec = 10, .tv_usec = 0};
  ::setsockopt(stuck, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(uint16_t(s.port()));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::connect(stuck, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  const auto t0 = Clock::now();
  REQUIRE(send_all(stuck, request_text("POST", "/v1/chat/completions",
                                       R"({"messages":[{"role":"user","content":"Hello"}],"max_tokens":8192,)"
                                       R"("stream":true,"logprobs":true,"top_logprobs":20,"ignore_eos":true,)"
                                       R"("thinking":false})",
                                       {})));
  // The second slot: a keep-alive client served normally all along, completions and /metrics, until
  // the metrics count the stuck one's write timeout. Meanwhile both slots are held: a third client
  // is refused 503.
  const int other = connect_loopback(s.port());
  REQUIRE(other >= 0);
  int served = 0, refused = 0;
  bool cut = false;
  std::string metrics;
  while (!cut && seconds_since(t0) < 20) {
    const HttpResponse r = keep_alive(other, "POST", "/v1/completions", kCompletion);
    CHECK(r.status == 200);
    served += r.status == 200;
    metrics = keep_alive(other, "GET", "/metrics").body;
    cut = sample(metrics, R"(k3flow_requests_total{endpoint="timeout",status="499"})") == 1;
    if (!cut) refused += http(s.port(), "POST", "/v1/completions", kCompletion).status == 503;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  const double cut_after = seconds_since(t0);
  REQUIRE_MESSAGE(cut, "the stuck client still holds its slot after 20 s");
  CHECK(metrics.find(R"(endpoint="/v1/chat/completions",status="499")") == std::string::npos);
  CHECK(served > 0);
  CHECK(refused > 0);
  // The server reset the stuck connection: the stream it got is cut short.
  std::string raw;
  char buf[4096];
  ssize_t n = 0;
  while ((n = ::recv(stuck, buf, sizeof buf, 0)) > 0) raw.append(buf, size_t(n));
  CHECK((n == 0 || errno == ECONNRESET));
  CHECK(raw.rfind("HTTP/1.1 200", 0) == 0);
  CHECK(raw.find("[DONE]") == std::string::npos);
  ::close(stuck);
  // Its sequence was cancelled (at 8192 tokens it would run for tens of seconds)...
  double active = -1;
  for (const auto t1 = Clock::now(); seconds_since(t1) < 5;
       std::this_thread::sleep_for(std::chrono::milliseconds(50)))
    if ((active = sample(keep_alive(other, "GET", "/metrics").body, "k3flow_active_sequences")) == 0) break;
  CHECK(active == 0);
  // ...and its slot (the other is still held) serves a new client, retrying its 503s, at once.
  HttpResponse got;
  const auto t1 = Clock::now();
  while (seconds_since(t1) < 5) {
    got = http(s.port(), "POST", "/v1/completions", kCompletion);
    if (got.status != 503) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  CHECK(got.status == 200);
  ::close(other);
  MESSAGE("the stuck client was cut after " << cut_after << " s; meanwhile " << served << " requests served, "
                                            << refused << " refused");
  CHECK(s.stop(SIGTERM) == 0);
}

TEST_CASE("a keep-alive connection serves several requests, then is closed after --idle-seconds") {
  ServeChild s(kTiny + " --idle-seconds 0.5");
  const int fd = connect_loopback(s.port());
  REQUIRE(fd >= 0);
  for (int i = 0; i < 2; ++i) CHECK(keep_alive(fd, "GET", "/v1/models").status == 200);
  const auto t0 = Clock::now();
  CHECK(read_until_closed(fd).empty());
  const double idle = seconds_since(t0);
  CHECK(idle >= 0.4);
  CHECK(idle < 10);
  ::close(fd);
}

TEST_CASE("headers a client acts on: WWW-Authenticate, any-case Bearer, Retry-After while loading") {
  SUBCASE("API key") {
    ServeChild s(kTiny + " --api-key sekrit");
    const HttpResponse no = http(s.port(), "GET", "/v1/models");
    CHECK(no.status == 401);
    CHECK(header(no, "www-authenticate") == "Bearer");
    CHECK(error_type(no) == "authentication_error");
    CHECK(http(s.port(), "GET", "/v1/models", "", {"Authorization: Bearer wrong"}).status == 401);
    CHECK(http(s.port(), "GET", "/v1/models", "", {"Authorization: Basic sekrit"}).status == 401);
    CHECK(http(s.port(), "GET", "/v1/models", "", {"Authorization: Bearer"}).status == 401);
    for (const char* scheme : {"Bearer", "bearer", "BEARER"}) {
      CAPTURE(scheme);
      CHECK(
          http(s.port(), "GET", "/v1/models", "", {fmt::format("Authorization: {} sekrit", scheme)}).status ==
          200);
    }
  }
  SUBCASE("503 while the model loads") {
    ServeChild s(kTiny, "K3FLOW_TEST_LOAD_DELAY_MS=3000", /*wait_ready=*/false);
    const HttpResponse r = http(s.port(), "POST", "/v1/completions", kCompletion);
    CHECK(r.status == 503);
    CHECK(header(r, "retry-after") == "1");
    CHECK(header(http(s.port(), "GET", "/health"), "retry-after") == "1");
  }
}

TEST_CASE("GET /v1/models/{id}: the served model, or 404 with OpenAI's error body") {
  ServeChild s(kTiny + " --model-name org/k3-tiny");
  const HttpResponse r = http(s.port(), "GET", "/v1/models/org%2Fk3-tiny");
  REQUIRE(r.status == 200);
  simdjson::dom::parser p;
  simdjson::dom::element m = p.parse(r.body);
  CHECK(std::string_view(m["id"]) == "org/k3-tiny");
  CHECK(std::string_view(m["object"]) == "model");
  CHECK(std::string_view(m["owned_by"]) == "k3flow");
  CHECK(http(s.port(), "GET", "/v1/models/org/k3-tiny").status == 200);  // unescaped, as some clients send
  const HttpResponse other = http(s.port(), "GET", "/v1/models/gpt-4");
  CHECK(other.status == 404);
  CHECK(error_type(other) == "invalid_request_error");
  CHECK(other.body.find("gpt-4") != std::string::npos);
  CHECK(http(s.port(), "POST", "/v1/models/org%2Fk3-tiny", "{}").status == 405);
}

TEST_CASE("CORS: --cors answers the preflight and marks every answer; without it OPTIONS is 405") {
  {
    ServeChild plain(kTiny);
    const HttpResponse r = http(plain.port(), "OPTIONS", "/v1/chat/completions");
    CHECK(r.status == 405);
    CHECK(r.headers.count("access-control-allow-origin") == 0);
    CHECK(http(plain.port(), "GET", "/v1/models").headers.count("access-control-allow-origin") == 0);
  }
  ServeChild s(kTiny + " --cors https://app.example --api-key sekrit");
  // The browser's preflight carries no credentials: answered before the key is checked.
  const HttpResponse pre = http(s.port(), "OPTIONS", "/v1/chat/completions", "",
                                {"Origin: https://app.example", "Access-Control-Request-Method: POST",
                                 "Access-Control-Request-Headers: authorization, content-type"});
  CHECK(pre.status == 204);
  CHECK(header(pre, "access-control-allow-origin") == "https://app.example");
  CHECK(header(pre, "access-control-allow-methods").find("POST") != std::string::npos);
  CHECK(header(pre, "access-control-allow-headers") == "authorization, content-type");
  CHECK(pre.headers.count("content-length") == 0);
  const std::vector<std::string> auth = {"Authorization: Bearer sekrit", "Origin: https://app.example"};
  const HttpResponse models = http(s.port(), "GET", "/v1/models", "", auth);
  CHECK(models.status == 200);
  CHECK(header(models, "access-control-allow-origin") == "https://app.example");
  CHECK(header(models, "vary") == "Origin");
  // Errors and streams too: a browser can read neither without it.
  CHECK(header(http(s.port(), "GET", "/v1/models"), "access-control-allow-origin") == "https://app.example");
  const HttpResponse st =
      http(s.port(), "POST", "/v1/completions", R"({"prompt":"Hello","max_tokens":2,"stream":true})", auth);
  CHECK(st.status == 200);
  CHECK(header(st, "access-control-allow-origin") == "https://app.example");
  for (const char* bad : {"--cors ''", "--cors 'a b'", "--cors 'https://a,https://b'"}) {
    CAPTURE(bad);
    const Run r = k3flow_sh(fmt::format("serve {} --port 0 {}", kTiny, bad), "", 60);
    CHECK(r.code == 2);
    CHECK(r.err.find("--cors") != std::string::npos);
    CHECK(r.out.find("listening") == std::string::npos);
  }
}

TEST_CASE("start-up: refusals come before 'listening'; a port in use ends the command before the load") {
  SUBCASE("a port in use: exit 1 at once, naming it, though the load would take 30 s") {
    ServeChild first(kTiny);
    const auto t0 = Clock::now();
    const Run r =
        k3flow(fmt::format("serve {} --port {}", kTiny, first.port()), "K3FLOW_TEST_LOAD_DELAY_MS=30000", 60);
    CHECK(r.code == 1);
    CHECK(seconds_since(t0) < 10);
    CHECK(r.err.find(fmt::format("--port {}", first.port())) != std::string::npos);
    CHECK(r.err.find("cannot listen") != std::string::npos);
    CHECK(r.out.find("listening") == std::string::npos);
  }
  SUBCASE("a budget below the plan's floor: exit 2 before listening") {
    const Run r = k3flow(fmt::format("serve {} --port 0 --mem-gb 0.001", kTiny), "", 60);
    CHECK(r.code == 2);
    CHECK(r.err.find("floor") != std::string::npos);
    CHECK(r.out.find("listening") == std::string::npos);
  }
  SUBCASE("an unknown preset: refused before the model directory is even looked at") {
    const Run r = k3flow("serve /no/such/model --port 0 --preset phone", "", 60);
    CHECK(r.code == 2);
    CHECK(r.err.find("unknown preset 'phone'") != std::string::npos);
    CHECK(r.out.find("listening") == std::string::npos);
  }
  SUBCASE("a truncated shard: exit 1 naming the file, and 'listening' is never printed") {
    TempDir d;
    const std::string m = d / "m";
    const Run sy = k3flow(fmt::format("synth {} --size tiny --layers 2 --shards 2 --seed 1", m));
    REQUIRE_MESSAGE(sy.code == 0, sy.err);
    const std::filesystem::path shard = std::filesystem::path(m) / "model-00002-of-000002.safetensors";
    REQUIRE(std::filesystem::exists(shard));
    std::filesystem::resize_file(shard, std::filesystem::file_size(shard) - 4096);
    // No budget flag: nothing plans the run before the port, yet the headers are checked there.
    const Run r = k3flow(fmt::format("serve {} --port 0", m), "", 60);
    CHECK(r.code == 1);
    CHECK(r.err.find(shard.string()) != std::string::npos);
    CHECK(r.err.find("lie outside the data section") != std::string::npos);
    CHECK(r.out.find("listening") == std::string::npos);
  }
  SUBCASE("a checkpoint that fails to load: the server stops at once, the port closes, exit 1") {
    TempDir d;
    const std::filesystem::path m = d.path / "m";
    std::filesystem::copy(kTiny, m);
    // The load is held 1 s so that /health can be seen answering 503 first; the shard, whole when
    // the headers were checked before 'listening', is cut while the load waits.
    ServeChild s(m.string(), "K3FLOW_TEST_LOAD_DELAY_MS=1000", /*wait_ready=*/false);
    const int port = s.port();
    const std::filesystem::path shard = m / "model-00001-of-000001.safetensors";
    std::filesystem::resize_file(shard, std::filesystem::file_size(shard) - 4096);
    CHECK(http(port, "GET", "/health").status == 503);
    CHECK(s.wait_exit(30) == 1);
    CHECK(s.err().find("lie outside the data section") != std::string::npos);
    CHECK(connect_loopback(port, 1) < 0);  // a /health poller sees the connection refused
  }
}

TEST_CASE("the load's lines reach stderr as they are printed, before 'listening' and while serving") {
  // The load is held, so the process is surely still running when stderr is read.
  ServeChild s(kTiny, "K3FLOW_TEST_LOAD_DELAY_MS=1500", /*wait_ready=*/false);
  const std::string at_listening = s.err();
  // The config's summary is printed before the port is bound: it is there once 'listening' is.
  CHECK(at_listening.find("config: ") != std::string::npos);
  CHECK(at_listening.find(" layers=") != std::string::npos);
  // The load's own lines arrive while the server runs, not when it exits.
  bool loaded = false;
  for (int i = 0; i < 3000 && !loaded; ++i) {
    loaded = s.err().find("k3flow serve: ready") != std::string::npos;
    if (!loaded) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  REQUIRE(loaded);
  const std::string running = s.err();
  CHECK(running.find("indexed ") != std::string::npos);
  CHECK(s.running());
  CHECK(s.stop(SIGTERM) == 0);
}

TEST_CASE("SIGTERM: the shutdown line says what was in flight and what was closed") {
  ServeChild s(kTiny);
  const int idle = connect_loopback(s.port());
  REQUIRE(idle >= 0);
  // The idle connection is counted once the server has accepted it: a request on another one
  // proves the accept loop has passed it.
  CHECK(http(s.port(), "GET", "/v1/models").status == 200);
  CHECK(s.stop(SIGTERM) == 0);
  const std::string err = s.err();
  const std::string line =
      "k3flow serve: stopped by SIGTERM: 0 requests in flight, 0 finished, 0 cancelled at the 10 s drain "
      "bound; ";
  const size_t at = err.find(line);
  REQUIRE_MESSAGE(at != std::string::npos, err);
  // The idle one, and the models request's own if its thread had not counted itself out yet.
  const int closed = std::atoi(err.c_str() + at + line.size());
  CHECK(closed >= 1);
  CHECK(closed <= 2);
  ::close(idle);
}
