#include "pipeline/serve/http.hpp"

#include <fmt/format.h>
#include <poll.h>
#include <sys/socket.h>

#include <boost/asio/connect.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <cerrno>
#include <chrono>
#include <climits>
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

using Clock = std::chrono::steady_clock;

namespace {

// Waits until `sock` is ready for `events` (or has a hang-up or error, which the read or write that
// follows reports) or `deadline` passes: false then.
bool wait_for(tcp::socket& sock, short events, Clock::time_point deadline) {
  for (;;) {
    const int64_t left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) return false;
    pollfd p{.fd = sock.native_handle(), .events = events, .revents = 0};
    const int r = ::poll(&p, 1, int(std::min<int64_t>(left, INT_MAX)));
    if (r > 0 || (r < 0 && errno != EINTR)) return true;
  }
}

bool wait_readable(tcp::socket& sock, Clock::time_point deadline) {
  return wait_for(sock, POLLIN, deadline);
}

// Connection sockets are non-blocking (set at accept): every wait for a client is a poll with a
// deadline, never a blocking call that a silent or stuck client could hold for ever.

// The connection's socket as Beast's synchronous read stream, with a deadline for the whole request:
// each read waits at most until `deadline`, then fails with timed_out. (A per-read timeout would let
// a client that trickles a byte at a time hold the connection for ever.)
struct DeadlineReader {
  tcp::socket& sock;
  Clock::time_point deadline;
  template <class Buffers>
  size_t read_some(const Buffers& b, beast::error_code& ec) {
    for (;;) {
      if (!wait_readable(sock, deadline)) {
        ec = net::error::timed_out;
        return 0;
      }
      const size_t n = sock.read_some(b, ec);
      if (ec != net::error::would_block) return n;
    }
  }
  template <class Buffers>
  size_t read_some(const Buffers& b) {
    beast::error_code ec;
    const size_t n = read_some(b, ec);
    if (ec) throw beast::system_error(ec);
    return n;
  }
};

// The connection's socket as Beast's and Asio's synchronous write stream, with a deadline for one
// whole write (an answer, or one event of a stream): what the kernel cannot take at once is waited
// for in poll(POLLOUT) at most until `deadline`, then the write fails with timed_out and
// `*timed_out` is set. (Asio's write on a blocking socket would wait for ever on a client that
// stopped reading once its buffers are full, and SO_SNDTIMEO does not bound it: on EAGAIN Asio polls
// again without a timeout.)
struct DeadlineWriter {
  tcp::socket& sock;
  Clock::time_point deadline;
  bool* timed_out;
  template <class Buffers>
  size_t write_some(const Buffers& b, beast::error_code& ec) {
    for (;;) {
      const size_t n = sock.write_some(b, ec);
      if (ec != net::error::would_block) return n;
      if (!wait_for(sock, POLLOUT, deadline)) {
        ec = net::error::timed_out;
        *timed_out = true;
        return 0;
      }
    }
  }
  template <class Buffers>
  size_t write_some(const Buffers& b) {
    beast::error_code ec;
    const size_t n = write_some(b, ec);
    if (ec) throw beast::system_error(ec);
    return n;
  }
};

// A connection as the handlers see it: its socket, how long one write to it may take, and whether a
// write has timed out (the client stopped reading: the connection is closed, counted as a timeout).
struct Conn {
  tcp::socket& sock;
  std::chrono::milliseconds write_bound;
  bool write_timed_out = false;
  DeadlineWriter writer() { return {sock, Clock::now() + write_bound, &write_timed_out}; }
};

}  // namespace

struct Server::Impl {
  Impl(ServerOptions o, const io::text::Tokenizer& t)
      : opt(std::move(o)), tok(t), acceptor(ioc), started(std::time(nullptr)) {}

  ServerOptions opt;
  Scheduler* sched_ptr = nullptr;  // set by run(), before the first connection is accepted
  const io::text::Tokenizer& tok;
  Metrics metrics;
  net::io_context ioc;
  tcp::acceptor acceptor;
  int64_t started;
  std::atomic<uint64_t> next_id{1};
  std::atomic<bool> stopping{false};
  std::atomic<bool> draining{false};    // the scheduler is stopping: a cancelled request is the stop's
  std::atomic<int> drain_cancelled{0};  // requests cut at the drain bound

  std::mutex m;
  std::condition_variable cv;
  std::set<int> open_fds;  // connection sockets, shut down for reading at the end
  int connections = 0;

  Scheduler& sched() const { return *sched_ptr; }
  void session(tcp::socket sock);
  // The headers every answer carries: Server, CORS's Allow-Origin (with --cors), Retry-After on 429
  // and 503, WWW-Authenticate on 401.
  void decorate(http::fields& h, int status) const;
  // One whole answer; returns the status sent (0: the write failed or timed out, the client was gone
  // or not reading).
  int send(Conn& c, int status, std::string body, bool keep_alive,
           const char* type = "application/json") const;
  int preflight(Conn& c, const http::request<http::string_body>& req, bool keep_alive) const;
  bool authorized(const http::request<http::string_body>& req) const;
  // Answers one request; returns the status sent (0: none, the client was gone or stopped reading).
  int handle(Conn& c, const http::request<http::string_body>& req, bool keep_alive, std::string& endpoint);
  int generate(Conn& c, const http::request<http::string_body>& req, Endpoint ep, bool keep_alive);
};

namespace {

std::string json_error(int status, const std::string& type, const std::string& message) {
  return error_body(ApiError(status, type, message));
}

bool client_gone(tcp::socket& sock) {
  pollfd p{.fd = sock.native_handle(), .events = POLLRDHUP, .revents = 0};
  return ::poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0;
}

// Beast's string_view is Boost's own in Debian's Boost 1.74 (no conversion to std's).
std::string_view view(beast::string_view v) {
  return {v.data(), v.size()};
}

bool iequal(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) == std::tolower(static_cast<unsigned char>(y));
         });
}

// A path segment with its %XX escapes decoded (a model id may hold '/', which clients escape).
std::string percent_decoded(std::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '%' && i + 2 < s.size() && std::isxdigit(static_cast<unsigned char>(s[i + 1])) &&
        std::isxdigit(static_cast<unsigned char>(s[i + 2]))) {
      out += char(std::stoi(std::string(s.substr(i + 1, 2)), nullptr, 16));
      i += 2;
    } else {
      out += s[i];
    }
  }
  return out;
}

double seconds(std::chrono::milliseconds d) {
  return double(d.count()) / 1000.0;
}

}  // namespace

void Server::Impl::decorate(http::fields& h, int status) const {
  h.set(http::field::server, "k3flow");
  if (opt.cors_origin) {
    h.set(http::field::access_control_allow_origin, *opt.cors_origin);
    if (*opt.cors_origin != "*") h.set(http::field::vary, "Origin");
  }
  // A client's retry loop (the openai package's among them) honours it: the queue or the load
  // usually moves within a second.
  if (status == 429 || status == 503) h.set(http::field::retry_after, "1");
  if (status == 401) h.set(http::field::www_authenticate, "Bearer");
}

int Server::Impl::send(Conn& c, int status, std::string body, bool keep_alive, const char* type) const {
  http::response<http::string_body> res{http::status(unsigned(status)), 11};
  decorate(res, status);
  if (!body.empty()) res.set(http::field::content_type, type);
  res.keep_alive(keep_alive);
  res.body() = std::move(body);
  res.prepare_payload();
  beast::error_code ec;
  DeadlineWriter w = c.writer();
  http::write(w, res, ec);
  return ec ? 0 : status;
}

// A browser's CORS preflight: which methods and headers the real request may use. Asked without
// credentials, so it is answered before the API key is checked.
int Server::Impl::preflight(Conn& c, const http::request<http::string_body>& req, bool keep) const {
  http::response<http::string_body> res{http::status::no_content, 11};
  decorate(res, 204);
  res.set(http::field::access_control_allow_methods, "GET, POST, OPTIONS");
  const std::string_view asked = view(req[http::field::access_control_request_headers]);
  res.set(http::field::access_control_allow_headers,
          asked.empty() ? std::string("Authorization, Content-Type") : std::string(asked));
  res.set(http::field::access_control_max_age, "600");
  res.keep_alive(keep);  // a 204 has no body and no Content-Length (RFC 9110 §8.6)
  beast::error_code ec;
  DeadlineWriter w = c.writer();
  http::write(w, res, ec);
  return ec ? 0 : 204;
}

// `Authorization: Bearer KEY`, the scheme in any case (RFC 9110 §11.1), the key exactly.
bool Server::Impl::authorized(const http::request<http::string_body>& req) const {
  const std::string_view h = view(req[http::field::authorization]);
  const size_t space = h.find(' ');
  if (space == std::string_view::npos || !iequal(h.substr(0, space), "bearer")) return false;
  const size_t key_at = h.find_first_not_of(' ', space);
  return key_at != std::string_view::npos && h.substr(key_at) == *opt.api_key;
}

void check_host(const std::string& host) {
  beast::error_code ec;
  net::ip::make_address(host, ec);
  if (ec) throw io::usage_error(fmt::format("--host {}: not an IP address", host));
}

Server::Server(ServerOptions o, const io::text::Tokenizer& t)
    : impl_(std::make_unique<Impl>(std::move(o), t)) {
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

DrainReport Server::run(Scheduler& sched, const std::function<bool()>& stop,
                        std::chrono::milliseconds drain) {
  Impl& s = *impl_;
  s.sched_ptr = &sched;
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
    sock.non_blocking(true, ec);
    {
      std::unique_lock lock(s.m);
      if (s.connections >= s.opt.max_connections) {
        lock.unlock();
        // One try, no wait (the accept loop never waits on a client): a fresh socket's send buffer
        // takes the short answer whole.
        Conn refused{sock, 0ms};
        s.send(refused, 503, json_error(503, "server_error", "too many connections; try again"), false);
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
  DrainReport report;
  report.in_flight = sched.gauges().active.load() + sched.gauges().queued.load();
  {
    std::lock_guard lock(s.m);
    report.connections = s.connections;
  }
  s.draining = true;
  sched.stop(drain);
  s.stopping = true;
  std::unique_lock lock(s.m);
  for (int fd : s.open_fds) ::shutdown(fd, SHUT_RD);
  s.cv.wait_for(lock, 5s, [&] { return s.connections == 0; });
  report.cancelled = s.drain_cancelled.load();
  return report;
}

void Server::Impl::session(tcp::socket sock) {
  Conn c{sock, opt.write};
  beast::flat_buffer buf;
  for (;;) {
    // Between requests the connection may sit idle for `idle` (a keep-alive client's pool);
    // silent longer, it is closed without an answer, as an idle keep-alive is.
    if (buf.size() == 0 && !wait_readable(sock, Clock::now() + opt.idle)) break;
    DeadlineReader reader{sock, Clock::now() + opt.read};
    http::request_parser<http::string_body> parser;
    parser.body_limit(opt.max_body_bytes);
    parser.header_limit(64 * 1024);
    beast::error_code ec;
    http::read_header(reader, buf, parser, ec);
    if (!ec && parser.get()[http::field::expect] == "100-continue") {
      // curl asks before sending a body over 1 KiB; a refused size is answered below without it.
      const auto& h = parser.get();
      if (!h.has_content_length() || *parser.content_length() <= opt.max_body_bytes) {
        DeadlineWriter w = c.writer();
        net::write(w, net::buffer(std::string_view("HTTP/1.1 100 Continue\r\n\r\n")), ec);
      }
    }
    if (c.write_timed_out) {
      metrics.count("timeout", 499);
      break;
    }
    if (!ec) http::read(reader, buf, parser, ec);
    if (ec == net::error::timed_out) {
      const int st = send(c, 408,
                          json_error(408, "invalid_request_error",
                                     fmt::format("the request did not arrive within {} s (--read-seconds)",
                                                 seconds(opt.read))),
                          false);
      metrics.count("timeout", st ? st : 408);
      break;
    }
    if (ec == http::error::body_limit) {
      const int st =
          send(c, 413,
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
            send(c, 400, json_error(400, "invalid_request_error", "malformed HTTP request"), false);
        metrics.count("malformed", st ? st : 400);
      }
      break;
    }
    const http::request<http::string_body>& req = parser.get();
    const bool keep = req.keep_alive() && !stopping;
    std::string endpoint;
    const int status = handle(c, req, keep, endpoint);
    // A client that stopped reading: its answer did not go out within --write-seconds (its sequence,
    // if any, is cancelled); counted as a timeout rather than under its route.
    if (c.write_timed_out)
      metrics.count("timeout", 499);
    else
      metrics.count(endpoint, status ? status : 499);
    if (!keep || !status) break;
  }
  beast::error_code ec;
  if (c.write_timed_out)
    // Reset, not FIN: the answer still queued in the kernel for a client that does not read would
    // otherwise outlive the connection.
    sock.set_option(net::socket_base::linger(true, 0), ec);
  else
    sock.shutdown(tcp::socket::shutdown_both, ec);
  std::lock_guard lock(m);
  open_fds.erase(sock.native_handle());
  sock.close(ec);
  --connections;
  cv.notify_all();
}

int Server::Impl::handle(Conn& c, const http::request<http::string_body>& req, bool keep,
                         std::string& endpoint) {
  std::string_view target = view(req.target());
  target = target.substr(0, target.find('?'));
  endpoint = std::string(target);
  const bool get = req.method() == http::verb::get, post = req.method() == http::verb::post;
  const auto wrong_method = [&](const char* allowed) {
    return send(c, 405,
                json_error(405, "invalid_request_error",
                           fmt::format("{} {}: use {}", std::string(req.method_string()), target, allowed)),
                keep);
  };
  if (req.method() == http::verb::options && opt.cors_origin) return preflight(c, req, keep);
  if (target == "/health") {
    if (!get) return wrong_method("GET");
    io::JsonWriter w;
    const Phase ph = sched().phase();
    w.begin_object().field("status", phase_name(ph)).field("model", opt.model);
    if (ph == Phase::loading) {
      w.field("phase", "loading weights")
          .field("bytes_read", sched().gauges().load_bytes_read.load())
          .field("checkpoint_bytes", sched().gauges().load_bytes_total.load());
    } else if (ph == Phase::ready) {
      w.field("max_seqs", sched().max_seqs())
          .field("context", sched().capacity())
          .field("active", sched().gauges().active.load())
          .field("queued", sched().gauges().queued.load());
    }
    w.end_object();
    return send(c, ph == Phase::ready ? 200 : 503, w.str(), keep);
  }
  if (opt.api_key && !authorized(req)) {
    return send(c, 401,
                json_error(401, "authentication_error",
                           "missing or wrong API key (send the header Authorization: Bearer KEY)"),
                keep);
  }
  if (target == "/metrics") {
    if (!get) return wrong_method("GET");
    return send(c, 200, metrics.render(sched()), keep, "text/plain; version=0.0.4; charset=utf-8");
  }
  if (target == "/v1/models") {
    if (!get) return wrong_method("GET");
    return send(c, 200, models_body(opt.model, started), keep);
  }
  if (constexpr std::string_view models = "/v1/models/"; target.substr(0, models.size()) == models) {
    endpoint = "/v1/models/{id}";  // one label for every id asked
    if (!get) return wrong_method("GET");
    const std::string id = percent_decoded(target.substr(models.size()));
    if (id != opt.model)
      return send(
          c, 404,
          json_error(404, "invalid_request_error",
                     fmt::format("The model '{}' does not exist (this server serves '{}')", id, opt.model)),
          keep);
    return send(c, 200, model_body(opt.model, started), keep);
  }
  if (target == "/v1/completions" || target == "/v1/chat/completions") {
    if (!post) return wrong_method("POST");
    return generate(c, req, target == "/v1/completions" ? Endpoint::completions : Endpoint::chat, keep);
  }
  endpoint = "other";
  return send(c, 404, json_error(404, "not_found_error", fmt::format("no route {}", target)), keep);
}

int Server::Impl::generate(Conn& c, const http::request<http::string_body>& req, Endpoint ep, bool keep) {
  if (sched().phase() != Phase::ready)
    return send(c, 503,
                json_error(503, "server_error",
                           fmt::format("the model is {} (GET /health)", phase_name(sched().phase()))),
                keep);
  ApiRequest ar;
  try {
    ar = parse_request(ep, req.body(),
                       ApiContext{.model = opt.model,
                                  .tok = tok,
                                  .capacity = sched().capacity(),
                                  .thinking = opt.thinking,
                                  .max_reply = opt.max_reply});
  } catch (const ApiError& e) {
    return send(c, e.status, error_body(e), keep);
  }
  auto ch = std::make_shared<Channel>(opt.channel_bytes);
  switch (sched().submit(ar.gen, ch)) {
    case Scheduler::Submit::queued:
      break;
    case Scheduler::Submit::queue_full:
      return send(c, 429,
                  json_error(429, "rate_limit_error",
                             "the queue is full (--queue); retry when a request has finished"),
                  keep);
    case Scheduler::Submit::not_ready:
    case Scheduler::Submit::stopping:
      return send(c, 503, json_error(503, "server_error", "the server is not accepting requests"), keep);
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
    decorate(head, 200);
    head.set(http::field::content_type, "text/event-stream");
    head.set(http::field::cache_control, "no-cache");
    head.keep_alive(keep);
    head.chunked(true);
    DeadlineWriter w = c.writer();
    http::write_header(w, head_sr, ec);
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
      gone = client_gone(c.sock);
    }
    if (gone) ch->cancel();
    if (!d || gone) continue;
    if (!ar.stream) {
      rb.add(*d);
      continue;
    }
    const std::string ev = rb.event(*d);
    if (!ev.empty()) {
      DeadlineWriter w = c.writer();
      net::write(w, http::make_chunk(net::buffer(ev)), ec);
    }
    if (ec) {
      gone = true;
      ch->cancel();
    }
  }
  const Outcome out = *ch->outcome();
  if (gone) return 0;
  if (out.finish == Finish::cancelled && draining) ++drain_cancelled;
  if (!ar.stream) {
    if (out.finish == Finish::error) return send(c, 500, json_error(500, "server_error", out.error), keep);
    if (out.finish == Finish::cancelled)
      return send(c, 503, json_error(503, "server_error", "cancelled: " + out.error), keep);
    return send(c, 200, rb.body(out), keep);
  }
  std::string tail;
  if (out.finish == Finish::error || out.finish == Finish::cancelled)
    tail = "data: " + json_error(500, "server_error", out.error.empty() ? "cancelled" : out.error) +
           "\n\ndata: [DONE]\n\n";
  else
    tail = rb.final_events(out);
  DeadlineWriter w = c.writer();
  net::write(w, http::make_chunk(net::buffer(tail)), ec);
  if (!ec) net::write(w, http::make_chunk_last(), ec);
  return ec ? 0 : 200;
}

}  // namespace k3::pipeline::serve
