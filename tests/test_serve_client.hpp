// For the serve tests: a `k3flow serve` child on a free port (it prints `listening on
// http://127.0.0.1:PORT`, which start() reads) and a plain-socket HTTP/1.1 client on loopback that
// reads whole responses (chunked bodies decoded) and Server-Sent Events.
#pragma once
#include <arpa/inet.h>
#include <doctest/doctest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "tests/run_helpers.hpp"

namespace k3::test {

struct HttpResponse {
  int status = 0;
  std::map<std::string, std::string> headers;  // names lower-cased
  std::string body;                            // chunked bodies decoded
};

// A connected socket to 127.0.0.1:port with a receive timeout; -1 on failure.
inline int connect_loopback(int port, int timeout_s = 60) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  timeval tv{.tv_sec = timeout_s, .tv_usec = 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(uint16_t(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

inline std::string request_text(const std::string& method, const std::string& path, const std::string& body,
                                const std::vector<std::string>& headers) {
  std::string r = method + " " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n";
  if (!body.empty() || method == "POST")
    r += "Content-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) + "\r\n";
  for (const std::string& h : headers) r += h + "\r\n";
  return r + "\r\n" + body;
}

inline bool send_all(int fd, const std::string& s) {
  size_t at = 0;
  while (at < s.size()) {
    const ssize_t n = ::send(fd, s.data() + at, s.size() - at, MSG_NOSIGNAL);
    if (n <= 0) return false;
    at += size_t(n);
  }
  return true;
}

inline HttpResponse parse_response(const std::string& raw) {
  HttpResponse r;
  const size_t head_end = raw.find("\r\n\r\n");
  if (head_end == std::string::npos || raw.compare(0, 5, "HTTP/") != 0) return r;
  r.status = std::atoi(raw.c_str() + raw.find(' ') + 1);
  size_t at = raw.find("\r\n") + 2;
  while (at < head_end) {
    const size_t eol = raw.find("\r\n", at);
    const std::string line = raw.substr(at, eol - at);
    const size_t colon = line.find(':');
    std::string name = line.substr(0, colon);
    for (char& c : name) c = char(std::tolower(static_cast<unsigned char>(c)));
    r.headers[name] = line.substr(line.find_first_not_of(' ', colon + 1));
    at = eol + 2;
  }
  const std::string body = raw.substr(head_end + 4);
  if (r.headers["transfer-encoding"] != "chunked") {
    r.body = body;
    return r;
  }
  size_t p = 0;
  for (;;) {
    const size_t eol = body.find("\r\n", p);
    if (eol == std::string::npos) break;
    const size_t n = std::stoul(body.substr(p, eol - p), nullptr, 16);
    if (n == 0) break;
    r.body += body.substr(eol + 2, n);
    p = eol + 2 + n + 2;
  }
  return r;
}

// One request on its own connection (Connection: close), the whole response.
inline HttpResponse http(int port, const std::string& method, const std::string& path,
                         const std::string& body = "", const std::vector<std::string>& headers = {},
                         int timeout_s = 120) {
  const int fd = connect_loopback(port, timeout_s);
  REQUIRE(fd >= 0);
  REQUIRE(send_all(fd, request_text(method, path, body, headers)));
  std::string raw;
  char buf[65536];
  for (;;) {
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    raw.append(buf, size_t(n));
  }
  ::close(fd);
  return parse_response(raw);
}

// The `data: ...` payloads of an event stream, in order.
inline std::vector<std::string> sse_data(const std::string& body) {
  std::vector<std::string> out;
  size_t at = 0;
  while (at < body.size()) {
    size_t end = body.find("\n\n", at);
    if (end == std::string::npos) end = body.size();
    const std::string ev = body.substr(at, end - at);
    if (ev.rfind("data: ", 0) == 0) out.push_back(ev.substr(6));
    at = end + 2;
  }
  return out;
}

// `k3flow serve MODEL ARGS --port 0` as a child, stdout and stderr in files. `launcher` (e.g. mpirun
// and its flags) runs it when given: the child is then the launcher.
class ServeChild {
 public:
  ServeChild(const std::string& args, const std::string& env = "", bool wait_ready = true,
             int timeout_s = 120, const std::vector<std::string>& launcher = {}) {
    out_ = dir_ / "out";
    err_ = dir_ / "err";
    launched_ = !launcher.empty();
    std::vector<std::string> argv = words("serve " + args + " --port 0");
    argv.insert(argv.begin(), K3FLOW_BIN);
    argv.insert(argv.begin(), launcher.begin(), launcher.end());
    pid_ = ::fork();
    REQUIRE(pid_ >= 0);
    if (pid_ == 0) {
      for (const std::string& kv : words(env)) {
        const size_t eq = kv.find('=');
        ::setenv(kv.substr(0, eq).c_str(), kv.substr(eq + 1).c_str(), 1);
      }
      detail::redirect(out_, err_);
      std::vector<char*> cargv;
      for (std::string& a : argv) cargv.push_back(a.data());
      cargv.push_back(nullptr);
      ::execv(cargv[0], cargv.data());
      ::_exit(127);
    }
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
    while (port_ == 0 && std::chrono::steady_clock::now() < until) {
      const std::string out = slurp(out_);
      const size_t at = out.find("listening on http://127.0.0.1:");
      if (at != std::string::npos && out.find('\n', at) != std::string::npos)
        port_ = std::atoi(out.c_str() + at + 30);
      else if (exited())
        break;
      else
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    if (port_ == 0) end();  // a failing constructor runs no destructor
    REQUIRE_MESSAGE(port_ > 0, "serve did not listen: " << slurp(err_));
    while (wait_ready && std::chrono::steady_clock::now() < until) {
      if (http(port_, "GET", "/health").status == 200) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    if (wait_ready) {
      end();
      FAIL("serve was not ready in time: " << slurp(err_));
    }
  }
  ~ServeChild() { end(); }
  ServeChild(const ServeChild&) = delete;
  ServeChild& operator=(const ServeChild&) = delete;

  int port() const { return port_; }
  bool running() const { return pid_ > 0; }
  std::string out() const { return slurp(out_); }
  std::string err() const { return slurp(err_); }
  // Sends `sig` and waits (bounded) for the exit status: the exit code, or -1 after a kill.
  int stop(int sig = SIGTERM, int timeout_s = 30) {
    ::kill(pid_, sig);
    return wait_exit(timeout_s);
  }
  // Waits (bounded) for the child to exit by itself: its exit code, -1 after a signal or past the bound.
  int wait_exit(int timeout_s = 30) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
    int status = 0;
    while (std::chrono::steady_clock::now() < until) {
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return -1;  // the destructor kills it
  }

 private:
  void end() {
    // A launcher killed outright may leave its children running: it is asked to end them first.
    if (pid_ > 0 && launched_) stop(SIGTERM, 15);
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
      pid_ = -1;
    }
  }
  bool exited() {
    int status = 0;
    if (::waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      return true;
    }
    return false;
  }
  TempDir dir_;
  std::string out_, err_;
  bool launched_ = false;
  pid_t pid_ = -1;
  int port_ = 0;
};

}  // namespace k3::test
