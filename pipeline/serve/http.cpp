#include "pipeline/serve/http.hpp"

#include <fmt/format.h>
#include <poll.h>
#include <sys/socket.h>

#include <boost/asio/connect.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <ctime>
#include <thread>

#include "io/error.hpp"
#include "io/json_text.hpp"
#include "pipeline/serve/api.hpp"

namespace k3::pipeline::serve {

namespace beast = boost::beast;
namespace http = beast::http;
namespace net = boost::asio;
using tcp = net::ip::tcp;
using namespace std::chrono_literals;

struct Server::Impl {
  Impl(ServerOptions o, Scheduler& s, const io::text::Tokenizer& t)
      : opt(std::move(o)), sched(s), tok(t), acceptor(ioc), started(std::time(nullptr)) {}

  ServerOptions opt;
  Scheduler& sched;
  const io::text::Tokenizer& tok;
  Metrics metrics;
  net::io_context ioc;
  tcp::acceptor acceptor;
  int64_t started;
  std::atomic<uint64_t> next_id{1};
  std::atomic<bool> stopping{false};

  std::mutex m;
  std::condition_variable cv;
  std::set<int> open_fds;  // connection sockets, shut down for reading at the end
  int connections = 0;

  void session(tcp::socket sock);
  // Answers one request; returns the status sent (0: none, the client was gone).
  int handle(tcp::socket& sock, const http::request<http::string_body>& req, bool keep_alive,
             std::string& endpoint);
  int generate(tcp::socket& sock, const http::request<http::string_body>& req, Endpoint ep, bool keep_alive);
};

namespace {

std::string json_error(int status, const std::string& type, const std::string& message) {
  return error_body(ApiError(status, type, message));
}

bool client_gone(tcp::socket& sock) {
  pollfd p{.fd = sock.native_handle(), .events = POLLRDHUP, .revents = 0};
  return ::poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0;
}

int send(tcp::socket& sock, int status, std::string body, bool keep_alive,
         const char* type = "application/json") {
  http::response<http::string_body> res{http::status(unsigned(status)), 11};
  res.set(http::field::server, "k3flow");
  res.set(http::field::content_type, type);
  res.keep_alive(keep_alive);
  res.body() = std::move(body);
  res.prepare_payload();
  beast::error_code ec;
  http::write(sock, res, ec);
  return ec ? 0 : status;
}

}  // namespace

void check_host(const std::string& host) {
  beast::error_code ec;
  net::ip::make_address(host, ec);
  if (ec) throw io::usage_error(fmt::format("--host {}: not an IP address", host));
}

Server::Server(ServerOptions o, Scheduler& s, const io::text::Tokenizer& t)
    : impl_(std::make_unique<Impl>(std::move(o), s, t)) {
  beast::error_code ec;
  const net::ip::address addr = net::ip::make_address(impl_->opt.host, ec);
  if (ec) throw io::usage_error(fmt::format("--host {}: not an IP address", impl_->opt.host));
  const tcp::endpoint ep(addr, impl_->opt.port);
  tcp::acceptor& a = impl_->acceptor;
  a.open(ep.protocol(), ec);
  if (!ec) a.set_option(net::socket_base::reuse_address(true), ec);
  if (!ec) a.bind(ep, ec);
  if (!ec) a.listen(net::socket_base::max_listen_connections, ec);
  if (ec)
    throw io::runtime_error(fmt::format("--host {} --port {}: cannot listen ({})", impl_->opt.host,
                                        impl_->opt.port, ec.message()));
  port_ = a.local_endpoint().port();
}

Server::~Server() = default;

void Server::run(const std::function<bool()>& stop, std::chrono::milliseconds drain) {
  Impl& s = *impl_;
  while (!stop()) {
    pollfd p{.fd = s.acceptor.native_handle(), .events = POLLIN, .revents = 0};
    if (::poll(&p, 1, 100) <= 0) continue;
    tcp::socket sock(s.ioc);
    beast::error_code ec;
    s.acceptor.accept(sock, ec);
    if (ec) continue;
    // Each SSE event is a small write; without this Nagle holds it until the client's delayed ACK
    // (~40 ms): the load test measured that as time to first token.
    sock.set_option(tcp::no_delay(true), ec);
    {
      std::unique_lock lock(s.m);
      if (s.connections >= s.opt.max_connections) {
        lock.unlock();
        send(sock, 503, json_error(503, "server_error", "too many connections; try again"), false);
        sock.close(ec);
        s.metrics.count("connections", 503);
        continue;
      }
      ++s.connections;
      s.open_fds.insert(sock.native_handle());
    }
    std::thread([&s, sk = std::move(sock)]() mutable { s.session(std::move(sk)); }).detach();
  }
  // Stop accepting; in-flight requests finish or are cancelled within the bound; then every
  // connection still waiting for a request is shut down for reading, which ends its thread.
  beast::error_code ec;
  s.acceptor.close(ec);
  s.sched.stop(drain);
  s.stopping = true;
  std::unique_lock lock(s.m);
  for (int fd : s.open_fds) ::shutdown(fd, SHUT_RD);
  s.cv.wait_for(lock, 5s, [&] { return s.connections == 0; });
}

void Server::Impl::session(tcp::socket sock) {
  beast::flat_buffer buf;
  for (;;) {
    http::request_parser<http::string_body> parser;
    parser.body_limit(opt.max_body_bytes);
    parser.header_limit(64 * 1024);
    beast::error_code ec;
    http::read_header(sock, buf, parser, ec);
    if (!ec && parser.get()[http::field::expect] == "100-continue") {
      // curl asks before sending a body over 1 KiB; a refused size is answered below without it.
      const auto& h = parser.get();
      if (!h.has_content_length() || *parser.content_length() <= opt.max_body_bytes)
        net::write(sock, net::buffer(std::string_view("HTTP/1.1 100 Continue\r\n\r\n")), ec);
    }
    if (!ec) http::read(sock, buf, parser, ec);
    if (ec == http::error::body_limit) {
      const int st =
          send(sock, 413,
               json_error(413, "invalid_request_error",
                          fmt::format("the body exceeds {} KiB (--max-body-kb)", opt.max_body_bytes / 1024)),
               false);
      metrics.count("body", st ? st : 413);
      break;
    }
    if (ec) {
      if (ec != http::error::end_of_stream && ec != net::error::eof && ec != net::error::connection_reset &&
          buf.size() > 0) {
        const int st =
            send(sock, 400, json_error(400, "invalid_request_error", "malformed HTTP request"), false);
        metrics.count("malformed", st ? st : 400);
      }
      break;
    }
    const http::request<http::string_body>& req = parser.get();
    const bool keep = req.keep_alive() && !stopping;
    std::string endpoint;
    const int status = handle(sock, req, keep, endpoint);
    metrics.count(endpoint, status ? status : 499);
    if (!keep || !status) break;
  }
  beast::error_code ec;
  sock.shutdown(tcp::socket::shutdown_both, ec);
  std::lock_guard lock(m);
  open_fds.erase(sock.native_handle());
  sock.close(ec);
  --connections;
  cv.notify_all();
}

int Server::Impl::handle(tcp::socket& sock, const http::request<http::string_body>& req, bool keep,
                         std::string& endpoint) {
  // Beast's string_view is Boost's own in Debian's Boost 1.74 (no conversion to std's): copy the span.
  std::string_view target(req.target().data(), req.target().size());
  target = target.substr(0, target.find('?'));
  endpoint = std::string(target);
  const bool get = req.method() == http::verb::get, post = req.method() == http::verb::post;
  const auto wrong_method = [&](const char* allowed) {
    return send(sock, 405,
                json_error(405, "invalid_request_error",
                           fmt::format("{} {}: use {}", std::string(req.method_string()), target, allowed)),
                keep);
  };
  if (target == "/health") {
    if (!get) return wrong_method("GET");
    io::JsonWriter w;
    const Phase ph = sched.phase();
    w.begin_object().field("status", phase_name(ph)).field("model", opt.model);
    if (ph == Phase::loading) {
      w.field("phase", "loading weights")
          .field("bytes_read", sched.gauges().load_bytes_read.load())
          .field("checkpoint_bytes", sched.gauges().load_bytes_total.load());
    } else if (ph == Phase::ready) {
      w.field("max_seqs", sched.max_seqs())
          .field("context", sched.capacity())
          .field("active", sched.gauges().active.load())
          .field("queued", sched.gauges().queued.load());
    }
    w.end_object();
    return send(sock, ph == Phase::ready ? 200 : 503, w.str(), keep);
  }
  if (opt.api_key) {
    const std::string want = "Bearer " + *opt.api_key;
    if (req[http::field::authorization] != want)
      return send(sock, 401,
                  json_error(401, "authentication_error",
                             "missing or wrong API key (send the header Authorization: Bearer KEY)"),
                  keep);
  }
  if (target == "/metrics") {
    if (!get) return wrong_method("GET");
    return send(sock, 200, metrics.render(sched), keep, "text/plain; version=0.0.4; charset=utf-8");
  }
  if (target == "/v1/models") {
    if (!get) return wrong_method("GET");
    return send(sock, 200, models_body(opt.model, started), keep);
  }
  if (target == "/v1/completions" || target == "/v1/chat/completions") {
    if (!post) return wrong_method("POST");
    return generate(sock, req, target == "/v1/completions" ? Endpoint::completions : Endpoint::chat, keep);
  }
  endpoint = "other";
  return send(sock, 404, json_error(404, "not_found_error", fmt::format("no route {}", target)), keep);
}

int Server::Impl::generate(tcp::socket& sock, const http::request<http::string_body>& req, Endpoint ep,
                           bool keep) {
  if (sched.phase() != Phase::ready)
    return send(sock, 503,
                json_error(503, "server_error",
                           fmt::format("the model is {} (GET /health)", phase_name(sched.phase()))),
                keep);
  ApiRequest ar;
  try {
    ar = parse_request(ep, req.body(),
                       ApiContext{.model = opt.model,
                                  .tok = tok,
                                  .capacity = sched.capacity(),
                                  .thinking = opt.thinking,
                                  .max_reply = opt.max_reply});
  } catch (const ApiError& e) {
    return send(sock, e.status, error_body(e), keep);
  }
  auto ch = std::make_shared<Channel>(opt.channel_bytes);
  switch (sched.submit(ar.gen, ch)) {
    case Scheduler::Submit::queued:
      break;
    case Scheduler::Submit::queue_full:
      return send(sock, 429,
                  json_error(429, "rate_limit_error",
                             "the queue is full (--queue); retry when a request has finished"),
                  keep);
    case Scheduler::Submit::not_ready:
    case Scheduler::Submit::stopping:
      return send(sock, 503, json_error(503, "server_error", "the server is not accepting requests"), keep);
  }
  const uint64_t n = next_id++;
  ResponseBuilder rb(ar, opt.model,
                     fmt::format("{}-{:x}{:04x}", ep == Endpoint::chat ? "chatcmpl" : "cmpl", started, n),
                     std::time(nullptr));
  beast::error_code ec;
  bool gone = false;
  http::response<http::empty_body> head{http::status::ok, 11};
  http::response_serializer<http::empty_body> head_sr{head};
  if (ar.stream) {
    head.set(http::field::server, "k3flow");
    head.set(http::field::content_type, "text/event-stream");
    head.set(http::field::cache_control, "no-cache");
    head.keep_alive(keep);
    head.chunked(true);
    http::write_header(sock, head_sr, ec);
    gone = bool(ec);
  }
  // Drain the channel; a client that has gone is cancelled, and the channel still runs to its outcome
  // (the scheduler frees the slot at its next step).
  auto checked = std::chrono::steady_clock::now();
  while (!ch->done()) {
    std::optional<Delta> d = ch->next(50ms);
    // Every 50 ms, deltas or not: a non-streamed request never writes until its end, so only the
    // socket's state tells that its client has gone.
    if (const auto t = std::chrono::steady_clock::now(); !gone && t - checked >= 50ms) {
      checked = t;
      gone = client_gone(sock);
    }
    if (gone) ch->cancel();
    if (!d || gone) continue;
    if (!ar.stream) {
      rb.add(*d);
      continue;
    }
    const std::string ev = rb.event(*d);
    if (!ev.empty()) net::write(sock, http::make_chunk(net::buffer(ev)), ec);
    if (ec) {
      gone = true;
      ch->cancel();
    }
  }
  const Outcome out = *ch->outcome();
  if (gone) return 0;
  if (!ar.stream) {
    if (out.finish == Finish::error) return send(sock, 500, json_error(500, "server_error", out.error), keep);
    if (out.finish == Finish::cancelled)
      return send(sock, 503, json_error(503, "server_error", "cancelled: " + out.error), keep);
    return send(sock, 200, rb.body(out), keep);
  }
  std::string tail;
  if (out.finish == Finish::error || out.finish == Finish::cancelled)
    tail = "data: " + json_error(500, "server_error", out.error.empty() ? "cancelled" : out.error) +
           "\n\ndata: [DONE]\n\n";
  else
    tail = rb.final_events(out);
  net::write(sock, http::make_chunk(net::buffer(tail)), ec);
  if (!ec) net::write(sock, http::make_chunk_last(), ec);
  return ec ? 0 : 200;
}

}  // namespace k3::pipeline::serve
