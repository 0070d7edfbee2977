// `k3flow serve`'s HTTP side: Boost.Beast's synchronous HTTP/1.1 on Boost.Asio sockets, one thread
// per connection (keep-alive, bounded by max_connections; more are answered 503 and closed). A
// connection thread never blocks the scheduler: it drains its request's Channel at its own pace,
// and a client that stops reading is cancelled once the channel's bound is passed. A client that
// disconnects is noticed (POLLRDHUP, or a failed write) and its sequence cancelled at the next step.
// A connection holds its slot only while it is useful: a request must start within `idle` of the
// connection opening (or of the previous response) and arrive whole within `read` of its first
// byte; otherwise the connection is closed (a request cut short is answered 408 first). Every write
// to the client (an answer, one event of a stream, 100 Continue) must be taken within `write`;
// otherwise the connection is reset and its sequence cancelled (counted as endpoint "timeout",
// status 499). So silent, trickling or non-reading sockets cannot lock other clients out.
//
// Routes: POST /v1/completions, POST /v1/chat/completions, GET /v1/models, GET /v1/models/{id},
// GET /health (open even with --api-key), GET /metrics; OPTIONS (CORS preflight) with --cors. Every
// error is OpenAI's {"error":{"message","type"}} body; 401 carries `WWW-Authenticate: Bearer`, 429
// and 503 `Retry-After`.
#pragma once
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>

#include "io/text/tokenizer.hpp"
#include "pipeline/serve/metrics.hpp"
#include "pipeline/serve/scheduler.hpp"

namespace k3::pipeline::serve {

struct ServerOptions {
  std::string host = "127.0.0.1";
  uint16_t port = 8080;  // 0: any free port (port() says which)
  std::optional<std::string> api_key;
  size_t max_body_bytes = 1 << 20;
  std::string model;  // the served model's name
  int max_connections = 64;
  size_t channel_bytes = 1 << 20;  // a request's text buffered for a slow client before it is cancelled
  std::chrono::milliseconds idle{30000};   // no request started this long after connect / a response: closed
  std::chrono::milliseconds read{30000};   // a request's headers and body must arrive within this
  std::chrono::milliseconds write{30000};  // each write to the client (an answer, one event) within this
  std::optional<std::string> cors_origin;  // Access-Control-Allow-Origin; OPTIONS preflight answered
  bool thinking = true;                    // chat requests that do not say (serve --thinking)
  int max_reply = 512;  // max_tokens' default for chat and cap for both (serve --max-reply)
};

// What the stop after a signal or a failed load did, for the shutdown line.
struct DrainReport {
  int in_flight = 0;    // requests queued or decoding when the server stopped accepting
  int cancelled = 0;    // of those, cut at the drain bound
  int connections = 0;  // connections still open then (idle keep-alives included), all closed
};

// Usage Error (exit 2) unless `host` is an IPv4 or IPv6 address (checked before the model loads).
void check_host(const std::string& host);

class Server {
 public:
  // Binds and listens; nothing is accepted before run(). Throws usage Error (exit 2) for a --host
  // that is not an address, runtime Error (exit 1) when the address cannot be bound. Called before
  // the model loads, so a port in use is reported at once.
  Server(ServerOptions, const io::text::Tokenizer&);
  ~Server();
  uint16_t port() const { return port_; }

  // Serves `sched` until `stop()` returns true (asked every 100 ms). Then it stops accepting, lets
  // the scheduler finish or cancel what is in flight within `drain`, answers what is left and closes
  // every connection.
  DrainReport run(Scheduler& sched, const std::function<bool()>& stop, std::chrono::milliseconds drain);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  uint16_t port_ = 0;
};

}  // namespace k3::pipeline::serve
