// `k3flow serve`'s HTTP side: Boost.Beast's synchronous HTTP/1.1 on Boost.Asio sockets, one thread
// per connection (keep-alive, bounded by max_connections; more are answered 503 and closed). A
// connection thread never blocks the scheduler: it drains its request's Channel at its own pace,
// and a client that stops reading is cancelled once the channel's bound is passed. A client that
// disconnects is noticed (POLLRDHUP, or a failed write) and its sequence cancelled at the next step.
//
// Routes: POST /v1/completions, POST /v1/chat/completions, GET /v1/models, GET /health (open even
// with --api-key), GET /metrics. Every error is OpenAI's {"error":{"message","type"}} body.
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
  bool thinking = true;            // chat requests that do not say (serve --thinking)
  int max_reply = 512;             // max_tokens' default for chat and cap for both (serve --max-reply)
};

// Usage Error (exit 2) unless `host` is an IPv4 or IPv6 address (checked before the model loads).
void check_host(const std::string& host);

class Server {
 public:
  // Binds and listens. Throws usage Error (exit 2) for a --host that is not an address, runtime
  // Error (exit 1) when the address cannot be bound.
  Server(ServerOptions, Scheduler&, const io::text::Tokenizer&);
  ~Server();
  uint16_t port() const { return port_; }

  // Accepts until `stop()` returns true (asked every 100 ms). Then it stops accepting, lets the
  // scheduler finish or cancel what is in flight within `drain`, answers what is left and closes
  // every connection.
  void run(const std::function<bool()>& stop, std::chrono::milliseconds drain);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  uint16_t port_ = 0;
};

}  // namespace k3::pipeline::serve
