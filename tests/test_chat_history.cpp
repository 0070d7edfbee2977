#include <doctest/doctest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "io/error.hpp"
#include "io/text/chat_history.hpp"
#include "tests/temp_dir.hpp"

namespace fs = std::filesystem;
using k3::test::TempDir;
using namespace k3::io::text;
using Role = ChatMessage::Role;

namespace {

std::vector<std::string> names(const fs::path& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename().string());
  return out;
}

void write(const fs::path& p, const std::string& bytes) {
  std::ofstream(p, std::ios::binary) << bytes;
}

std::string read(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string runtime_message(auto&& f) {
  try {
    f();
  } catch (const k3::io::Error& e) {
    CHECK(e.kind() == k3::io::ErrorKind::runtime);
    return e.what();
  }
  return "(no error)";
}

const std::string kUser = R"({"role": "user", "content": "hi"})";
const std::string kBot = R"({"role": "assistant", "content": "hello"})";

}  // namespace

TEST_CASE("history: round trip of awkward strings, byte for byte") {
  TempDir d;
  const fs::path file = d.path / "chat.jsonl";
  const std::vector<ChatMessage> h = {
      {Role::system, "quotes \" and \\ backslash \\\" \\n (literal)", std::nullopt},
      {Role::user, "line1\nline2\r\n\ttab \b\f \x01\x1f\x7f", std::nullopt},
      {Role::assistant, "emoji 🙂👍🏽, CJK 中文 日本語 한국어, U+2028 [\u2028]",
       "think: \"why?\"\n"},
      {Role::user, std::string("nul \0 inside", 12), std::nullopt},
      {Role::assistant, "", ""},
      {Role::user, "", std::nullopt},
      {Role::assistant, "no reasoning", std::nullopt},
  };
  save_history(file, h);
  CHECK(read(file) == history_jsonl(h));
  CHECK(load_history(file) == h);
  CHECK(names(d.path) == std::vector<std::string>{"chat.jsonl"});  // no temporary left behind

  // The exact serialisation.
  CHECK(history_jsonl(std::vector<ChatMessage>{h[1]}) ==
        "{\"role\": \"user\", \"content\": \"line1\\nline2\\r\\n\\ttab \\b\\f \\u0001\\u001f\x7f\"}\n");
  CHECK(history_jsonl(std::vector<ChatMessage>{h[2]}) ==
        "{\"role\": \"assistant\", \"content\": \"emoji 🙂👍🏽, CJK 中文 日本語 한국어, U+2028 "
        "[\u2028]\", "
        "\"reasoning_content\": \"think: \\\"why?\\\"\\n\"}\n");
  CHECK(history_jsonl(std::vector<ChatMessage>{h[3]}) ==
        "{\"role\": \"user\", \"content\": \"nul \\u0000 inside\"}\n");

  // Saving again replaces the file.
  const std::vector<ChatMessage> shorter(h.begin(), h.begin() + 3);
  save_history(file, shorter);
  CHECK(load_history(file) == shorter);
  CHECK(names(d.path) == std::vector<std::string>{"chat.jsonl"});
}

TEST_CASE("history: load accepts escapes, any key order, CRLF, no final newline") {
  TempDir d;
  const fs::path file = d.path / "h.jsonl";
  write(file, "{\"content\": \"\\u00e9\\ud83d\\ude00\\u4e2d\\/\", \"role\": \"system\"}\r\n" + kUser +
                  "\n{ \"reasoning_content\" : \"r\" , \"role\":\"assistant\",\"content\":\"a\" }");
  const std::vector<ChatMessage> want = {
      {Role::system, "é😀中/", std::nullopt}, {Role::user, "hi", std::nullopt}, {Role::assistant, "a", "r"}};
  CHECK(load_history(file) == want);

  CHECK(load_history(d.path / "missing.jsonl").empty());
  write(file, "");
  CHECK(load_history(file).empty());
  // A history may end with an unanswered user message.
  write(file, kUser + "\n");
  CHECK(load_history(file).size() == 1);
}

TEST_CASE("history: every load refusal names FILE:LINE and the reason") {
  TempDir d;
  const fs::path file = d.path / "h.jsonl";
  const std::string f = file.string();
  auto refusal = [&](const std::string& bytes) {
    write(file, bytes);
    return runtime_message([&] { load_history(file); });
  };
  CHECK(refusal("\n") == f + ":1: blank line");
  CHECK(refusal(kUser + "\n\n" + kBot + "\n") == f + ":2: blank line");
  CHECK(refusal(kUser + "\n \t\r\n") == f + ":2: blank line");
  CHECK(refusal(kUser + "\n\n") == f + ":2: blank line");
  CHECK(refusal("{\"role\": \"user\", \"content\": \"x\"\n").starts_with(f + ":1: not valid JSON ("));
  CHECK(refusal(kUser + " {}\n").starts_with(f + ":1: not valid JSON ("));
  CHECK(refusal("[\"user\", \"hi\"]\n") == f + ":1: not a JSON object");
  CHECK(refusal("\"hi\"\n") == f + ":1: not a JSON object");
  CHECK(refusal(kUser + "\n{\"role\": \"assistant\", \"content\": \"a\", \"name\": \"k3\"}\n") ==
        f + ":2: unknown key \"name\"");
  CHECK(refusal("{\"role\": \"user\", \"role\": \"user\", \"content\": \"x\"}\n") ==
        f + ":1: duplicate key \"role\"");
  CHECK(refusal("{\"role\": \"user\", \"content\": \"x\", \"content\": \"y\"}\n") ==
        f + ":1: duplicate key \"content\"");
  CHECK(refusal("{\"role\": \"user\", \"content\": 3}\n") == f + ":1: \"content\" must be a string");
  CHECK(refusal("{\"role\": null, \"content\": \"x\"}\n") == f + ":1: \"role\" must be a string");
  CHECK(refusal("{\"content\": \"x\"}\n") == f + ":1: missing \"role\"");
  CHECK(refusal("{\"role\": \"user\"}\n") == f + ":1: missing \"content\"");
  CHECK(refusal("{\"role\": \"bot\", \"content\": \"x\"}\n") ==
        f + ":1: role must be system, user or assistant (got \"bot\")");
  CHECK(refusal("{\"role\": \"user\", \"content\": \"x\", \"reasoning_content\": \"r\"}\n") ==
        f + ":1: reasoning_content on a user message (assistant only)");
  CHECK(refusal(kUser + "\n" + kUser + "\n") == f + ":2: role is user, expected assistant");
  CHECK(refusal(kBot + "\n") == f + ":1: role is assistant, expected user");
  CHECK(refusal(kUser + "\n{\"role\": \"system\", \"content\": \"s\"}\n") ==
        f + ":2: a system message may only come first");
  CHECK(refusal("{\"role\": \"user\", \"content\": \"\xff\"}\n").starts_with(f + ":1: not valid JSON ("));
  CHECK(refusal("{\"role\": \"user\", \"content\": \"a\nb\"}\n").starts_with(f + ":1: not valid JSON ("));

  // Unreadable: a directory.
  CHECK(runtime_message([&] { load_history(d.path); }).starts_with("cannot read " + d.path.string()));
}

TEST_CASE("history: save refuses what it could not load back, and leaves no file behind") {
  TempDir d;
  const fs::path file = d.path / "h.jsonl";
  const std::string f = file.string();
  CHECK(runtime_message([&] {
          save_history(file, std::vector<ChatMessage>{{Role::assistant, "a", std::nullopt}});
        }) == "cannot save " + f + ": message 1: role is assistant, expected user");
  CHECK(runtime_message([&] {
          save_history(file, std::vector<ChatMessage>{{Role::user, "bad \xc3", std::nullopt}});
        }) == "cannot save " + f + ": message 1: content is not valid UTF-8");
  CHECK(runtime_message([&] {
          save_history(file, std::vector<ChatMessage>{{Role::user, "q", std::nullopt},
                                                      {Role::assistant, "a", "\xe4\xb8"}});
        }) == "cannot save " + f + ": message 2: reasoning is not valid UTF-8");
  CHECK(names(d.path).empty());

  const fs::path nowhere = d.path / "no" / "such" / "h.jsonl";
  CHECK(runtime_message([&] {
          save_history(nowhere, std::vector<ChatMessage>{});
        }).starts_with("cannot write " + nowhere.string() + ": "));

  // A read-only directory: the temporary cannot be created and the old file stays as it was.
  if (::geteuid() != 0) {
    save_history(file, std::vector<ChatMessage>{{Role::user, "old", std::nullopt}});
    const std::string before = read(file);
    REQUIRE(::chmod(d.path.c_str(), 0555) == 0);
    CHECK(runtime_message([&] {
            save_history(file, std::vector<ChatMessage>{{Role::user, "new", std::nullopt}});
          }).starts_with("cannot write " + f + ": "));
    REQUIRE(::chmod(d.path.c_str(), 0755) == 0);
    CHECK(read(file) == before);
    CHECK(names(d.path) == std::vector<std::string>{"h.jsonl"});
  }
}
