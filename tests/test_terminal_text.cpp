// What the CLI shows a person: generated text's control characters escaped when stdout is a
// terminal (a pseudo-terminal here) and left raw when it is a pipe, in `generate` and in `chat`;
// `chat --jsonl` keeps one reply per line whatever it holds, a tool call's line is escaped like the
// reply (with --jsonl the calls are in the record instead); an unknown subcommand is named. The
// byte-level fixtures/tiny-k3 writes ESC, BS, DEL and friends in its greedy text, which is what makes
// these real inputs.
#include <doctest/doctest.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <pty.h>
#include <simdjson.h>
#include <sys/wait.h>
#include <termios.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "io/text/xtml.hpp"
#include "pipeline/support/terminal_text.hpp"
#include "tests/run_helpers.hpp"

using namespace k3::test;
using k3::pipeline::terminal_escaped;

namespace {

const std::string kTiny = std::string(K3_FIXTURES) + "/tiny-k3";

// `k3flow ARGS` with stdout on a pseudo-terminal in raw mode (no newline translation, so its bytes
// are the program's), stdin fed `input` through a pipe, stderr discarded: what the terminal got.
std::string on_terminal(const std::string& args, const std::string& input) {
  int master = -1, slave = -1;
  termios raw{};
  cfmakeraw(&raw);
  REQUIRE(::openpty(&master, &slave, nullptr, &raw, nullptr) == 0);
  int in[2];
  REQUIRE(::pipe(in) == 0);
  std::vector<std::string> argv = words(args);
  argv.insert(argv.begin(), K3FLOW_BIN);
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::dup2(in[0], 0);
    ::dup2(slave, 1);
    const int null = ::open("/dev/null", O_WRONLY);
    ::dup2(null, 2);
    ::close(in[1]);
    ::close(master);
    std::vector<char*> cargv;
    for (std::string& a : argv) cargv.push_back(a.data());
    cargv.push_back(nullptr);
    ::execv(cargv[0], cargv.data());
    ::_exit(127);
  }
  ::close(slave);
  ::close(in[0]);
  REQUIRE(::write(in[1], input.data(), input.size()) == ssize_t(input.size()));
  ::close(in[1]);
  std::string got;
  char buf[4096];
  for (;;) {  // EIO once the child has closed the terminal's last descriptor
    const ssize_t n = ::read(master, buf, sizeof buf);
    if (n <= 0) break;
    got.append(buf, size_t(n));
  }
  ::close(master);
  int status = 0;
  ::waitpid(pid, &status, 0);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  return got;
}

// Reverses the escapes: each `\xHH` back to its byte (C1 controls, `\u00HH`, back to UTF-8).
std::string unescaped(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s.compare(i, 2, "\\x") == 0 && i + 4 <= s.size()) {
      out += char(std::stoi(s.substr(i + 2, 2), nullptr, 16));
      i += 3;
    } else if (s.compare(i, 4, "\\u00") == 0 && i + 6 <= s.size()) {
      out += '\xc2';
      out += char(std::stoi(s.substr(i + 4, 2), nullptr, 16));
      i += 5;
    } else {
      out += s[i];
    }
  }
  return out;
}

size_t controls(const std::string& s) {
  return size_t(std::count_if(s.begin(), s.end(), [](char c) {
    const auto b = static_cast<unsigned char>(c);
    return (b < 0x20 && b != '\n' && b != '\t') || b == 0x7f;
  }));
}

}  // namespace

TEST_CASE("terminal_escaped: C0 controls but newline and tab, DEL and C1 controls; the rest as it is") {
  CHECK(terminal_escaped("plain text\n\tindented") == "plain text\n\tindented");
  CHECK(terminal_escaped(std::string("a\x1b[2Jb\rc\bd\x07", 11)) == "a\\x1b[2Jb\\x0dc\\x08d\\x07");
  CHECK(terminal_escaped(std::string("\0z\x7f", 3)) == "\\x00z\\x7f");
  CHECK(terminal_escaped("\xc2\x9b"
                         "31m") == "\\u009b31m");  // CSI as a UTF-8 C1 control
  // Printable UTF-8 next to them is untouched: é, a no-break space (C2 A0), the replacement char.
  CHECK(terminal_escaped("\xc3\xa9\xc2\xa0\xef\xbf\xbd") == "\xc3\xa9\xc2\xa0\xef\xbf\xbd");
}

TEST_CASE("generate: control characters escaped on a terminal, raw to a pipe") {
  const std::string args = fmt::format("generate {} --prompt Hi --gen 64 --no-progress", kTiny);
  const Run piped = k3flow(args, "", 120);
  REQUIRE(piped.code == 0);
  // The greedy text holds control characters (else this test could not fail) and no backslash
  // (which would make the escapes ambiguous to undo).
  REQUIRE(controls(piped.out) > 0);
  REQUIRE(piped.out.find('\\') == std::string::npos);
  const std::string shown = on_terminal(args, "");
  CHECK(controls(shown) == 0);
  CHECK(shown != piped.out);
  CHECK(unescaped(shown) == piped.out);
}

TEST_CASE("chat: escaped on a terminal; --jsonl keeps one reply per line") {
  const std::string args = fmt::format("chat {} --max-reply 24 --no-thinking", kTiny);
  const std::string input = "Hi\nMore\n";
  const Run piped = k3flow_sh(args + " 2>/dev/null <<'EOF'\n" + input + "EOF", "", 120);
  REQUIRE(piped.code == 0);
  REQUIRE(controls(piped.out) > 0);
  REQUIRE(piped.out.find('\\') == std::string::npos);
  // Two turns, but the replies' own newlines make more lines than that: what --jsonl is for.
  const auto lines = std::count(piped.out.begin(), piped.out.end(), '\n');
  CHECK(lines > 2);
  const std::string shown = on_terminal(args, input);
  CHECK(controls(shown) == 0);
  CHECK(unescaped(shown) == piped.out);

  const Run jsonl = k3flow_sh(args + " --jsonl 2>/dev/null <<'EOF'\n" + input + "EOF", "", 120);
  REQUIRE(jsonl.code == 0);
  std::istringstream in(jsonl.out);
  std::string line;
  int records = 0;
  std::string all_text;
  simdjson::dom::parser p;
  while (std::getline(in, line)) {
    ++records;
    simdjson::dom::element rec;
    REQUIRE_MESSAGE(!p.parse(line).get(rec), line);
    CHECK(int64_t(rec["tokens"]) == 24);
    CHECK(std::string_view(rec["stopped_by"]) == "the --max-reply cap");
    CHECK(std::string_view(rec["reasoning"]).empty());  // --no-thinking
    all_text += std::string_view(rec["reply"]);
  }
  CHECK(records == 2);
  // The records hold the very text the plain chat printed.
  std::string plain = piped.out;
  plain.erase(std::remove(plain.begin(), plain.end(), '\n'), plain.end());
  all_text.erase(std::remove(all_text.begin(), all_text.end(), '\n'), all_text.end());
  CHECK(all_text == plain);
}

TEST_CASE("chat --tools: a call's line is escaped on a terminal; with --jsonl the calls are in the record") {
  namespace text = k3::io::text;
  TempDir d;
  std::ofstream(d / "tools.json")
      << R"([{"type":"function","function":{"name":"get_weather","parameters":{"type":"object"}}}])";
  // The byte-level model never writes a call itself: the test hook gives every reply as K3 would
  // write one call -- to a name holding ESC, model text the terminal must not act on.
  text::ChatMessage call{text::ChatMessage::Role::assistant, ""};
  call.tool_calls = {{"", "get\x1b[2Jweather", R"({"city":"Paris"})"}};
  const std::string reply = text::join(text::render_completion(call, text::ChatOptions(false, "max")));
  ::setenv("K3FLOW_TEST_CHAT_REPLY", reply.c_str(), 1);
  const std::string args =
      fmt::format("chat {} --no-thinking --max-reply 4 --context 2048 --tools {}", kTiny, d / "tools.json");
  const std::string input = "Weather?\n/tool 12C\n";  // the result is answered by a second call
  const Run piped = k3flow_sh(args + " 2>/dev/null <<'EOF'\n" + input + "EOF", "", 120);
  const std::string shown = on_terminal(args, input);
  const Run jsonl = k3flow_sh(args + " --jsonl 2>/dev/null <<'EOF'\n" + input + "EOF", "", 120);
  ::unsetenv("K3FLOW_TEST_CHAT_REPLY");

  REQUIRE(piped.code == 0);
  const std::string line1 = "tool call call_1: get\x1b[2Jweather {\"city\":\"Paris\"}\n";
  CHECK(piped.out.find(line1) != std::string::npos);
  CHECK(piped.out.find("tool call call_2: ") != std::string::npos);
  CHECK(controls(shown) == 0);
  CHECK(shown.find("tool call call_1: get\\x1b[2Jweather") != std::string::npos);
  CHECK(unescaped(shown) == piped.out);

  // --jsonl: one record per turn and nothing else; the calls in the API's shape.
  REQUIRE(jsonl.code == 0);
  CHECK(jsonl.out.find("tool call") == std::string::npos);
  std::istringstream in(jsonl.out);
  std::string line;
  int records = 0;
  simdjson::dom::parser p;
  while (std::getline(in, line)) {
    ++records;
    CAPTURE(line);
    simdjson::dom::element rec;
    REQUIRE(!p.parse(line).get(rec));
    CHECK(std::string_view(rec["stopped_by"]) == "the end of the turn");
    simdjson::dom::array calls;
    REQUIRE(!rec["tool_calls"].get(calls));
    REQUIRE(calls.size() == 1);
    CHECK(std::string_view(calls.at(0)["id"]) == fmt::format("call_{}", records));
    CHECK(std::string_view(calls.at(0)["type"]) == "function");
    CHECK(std::string_view(calls.at(0)["function"]["name"]) == "get\x1b[2Jweather");
    CHECK(std::string_view(calls.at(0)["function"]["arguments"]) == R"({"city":"Paris"})");
  }
  CHECK(records == 2);
}

TEST_CASE("an unknown subcommand is named, with the list; none at all says which exist") {
  const Run bad = k3flow("serv " + kTiny);
  CHECK(bad.code == 2);
  CHECK(bad.err.find("unknown subcommand 'serv'") != std::string::npos);
  CHECK(bad.err.find("generate, chat") != std::string::npos);
  CHECK(std::count(bad.err.begin(), bad.err.end(), '\n') == 1);
  const Run none = k3flow("");
  CHECK(none.code == 2);
  CHECK(none.err.find("a subcommand is required: one of inspect") != std::string::npos);
}
