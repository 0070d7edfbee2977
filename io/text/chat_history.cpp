#include "io/text/chat_history.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <simdjson.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <optional>

#include "io/error.hpp"
#include "io/json_text.hpp"

namespace k3::io::text {

namespace {

namespace dom = simdjson::dom;
using Role = ChatMessage::Role;

bool blank(std::string_view line) {
  return line.find_first_not_of(" \t\r") == std::string_view::npos;
}

// One line to a message; throws the reason alone (the caller adds FILE:LINE).
struct LineError {
  std::string reason;
};

ChatMessage parse_line(dom::parser& parser, std::string_view line) {
  if (blank(line)) throw LineError{"blank line"};
  dom::element doc;
  if (auto err = parser.parse(line.data(), line.size()).get(doc))
    throw LineError{fmt::format("not valid JSON ({})", simdjson::error_message(err))};
  dom::object obj;
  if (doc.get(obj)) throw LineError{"not a JSON object"};
  std::optional<std::string_view> role, content, reasoning;
  for (dom::key_value_pair field : obj) {
    std::optional<std::string_view>* slot = nullptr;
    if (field.key == "role") slot = &role;
    if (field.key == "content") slot = &content;
    if (field.key == "reasoning_content") slot = &reasoning;
    if (!slot) throw LineError{fmt::format("unknown key \"{}\"", field.key)};
    if (slot->has_value()) throw LineError{fmt::format("duplicate key \"{}\"", field.key)};
    std::string_view value;
    if (field.value.get(value)) throw LineError{fmt::format("\"{}\" must be a string", field.key)};
    *slot = value;
  }
  if (!role) throw LineError{"missing \"role\""};
  if (!content) throw LineError{"missing \"content\""};
  const std::optional<Role> r = parse_role(*role);
  if (!r) throw LineError{fmt::format("role must be system, user or assistant (got \"{}\")", *role)};
  if (reasoning && *r != Role::assistant)
    throw LineError{fmt::format("reasoning_content on a {} message (assistant only)", *role)};
  ChatMessage m{*r, std::string(*content), std::nullopt};
  if (reasoning) m.reasoning = std::string(*reasoning);
  return m;
}

// Same-directory temporary, fsync, rename, fsync the directory so the rename itself is durable.
// (pipeline/ has the project's general writer; io/ may not depend on it.)
void write_atomic(const std::filesystem::path& path, std::string_view bytes) {
  static std::atomic<unsigned> counter{0};
  const std::filesystem::path dir = path.has_parent_path() ? path.parent_path() : ".";
  std::filesystem::path tmp;
  int fd = -1;
  for (int attempt = 0; attempt < 100 && fd < 0; ++attempt) {
    tmp = path;
    tmp += fmt::format(".tmp.{}.{}", ::getpid(), counter++);
    fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd < 0 && errno != EEXIST) break;
  }
  if (fd < 0) throw runtime_error(fmt::format("cannot write {}: {}", path.string(), std::strerror(errno)));
  int err = 0;
  for (size_t done = 0; done < bytes.size();) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      err = n < 0 ? errno : EIO;
      break;
    }
    done += static_cast<size_t>(n);
  }
  if (err == 0 && ::fsync(fd) != 0) err = errno;
  if (::close(fd) != 0 && err == 0) err = errno;
  if (err == 0 && ::rename(tmp.c_str(), path.c_str()) != 0) err = errno;
  if (err != 0) {
    ::unlink(tmp.c_str());
    throw runtime_error(fmt::format("cannot write {}: {}", path.string(), std::strerror(err)));
  }
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0 || ::fsync(dfd) != 0) err = errno;
  if (dfd >= 0) ::close(dfd);
  if (err != 0)
    throw runtime_error(
        fmt::format("cannot write {}: syncing {}: {}", path.string(), dir.string(), std::strerror(err)));
}

}  // namespace

std::vector<ChatMessage> load_history(const std::filesystem::path& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return {};
    throw runtime_error(fmt::format("cannot read {}: {}", path.string(), std::strerror(errno)));
  }
  std::string text;
  char buf[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      ::close(fd);
      throw runtime_error(fmt::format("cannot read {}: {}", path.string(), std::strerror(err)));
    }
    if (n == 0) break;
    text.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);

  std::vector<ChatMessage> msgs;
  dom::parser parser;
  size_t line_no = 0;
  for (size_t at = 0; at < text.size();) {
    const size_t nl = text.find('\n', at);
    const size_t end = nl == std::string::npos ? text.size() : nl;
    ++line_no;
    try {
      msgs.push_back(parse_line(parser, std::string_view(text).substr(at, end - at)));
    } catch (const LineError& e) {
      throw runtime_error(fmt::format("{}:{}: {}", path.string(), line_no, e.reason));
    }
    at = end + 1;
  }
  // Line i holds message i, so a message number is a line number.
  if (auto p = check_conversation(msgs, false))
    throw runtime_error(fmt::format("{}:{}: {}", path.string(), p->message, p->reason));
  return msgs;
}

std::string history_jsonl(std::span<const ChatMessage> msgs) {
  std::string out;
  for (const ChatMessage& m : msgs) {
    out += "{\"role\": ";
    out += io::json_quote(role_name(m.role));
    out += ", \"content\": ";
    out += io::json_quote(m.content);
    if (m.role == Role::assistant && m.reasoning) {
      out += ", \"reasoning_content\": ";
      out += io::json_quote(*m.reasoning);
    }
    out += "}\n";
  }
  return out;
}

void save_history(const std::filesystem::path& path, std::span<const ChatMessage> msgs) {
  if (auto p = check_conversation(msgs, false))
    throw runtime_error(fmt::format("cannot save {}: message {}: {}", path.string(), p->message, p->reason));
  for (size_t i = 0; i < msgs.size(); ++i) {
    const ChatMessage& m = msgs[i];
    const bool content_ok = simdjson::validate_utf8(m.content.data(), m.content.size());
    if (!content_ok || (m.reasoning && !simdjson::validate_utf8(m.reasoning->data(), m.reasoning->size())))
      throw runtime_error(fmt::format("cannot save {}: message {}: {} is not valid UTF-8", path.string(),
                                      i + 1, content_ok ? "reasoning" : "content"));
  }
  write_atomic(path, history_jsonl(msgs));
}

}  // namespace k3::io::text
