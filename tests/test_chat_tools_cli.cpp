// `k3flow chat --tools F.json` through a pipe on fixtures/tiny-k3 (byte vocabulary: a prompt's ids
// are the bytes of its rendered text): the declarations are in the prefix the first turn feeds,
// `/tool` without a waiting call is refused with a message and the session goes on, and a bad
// --tools file (one with a key no tool has included, or --tools with --history) exits 2 naming the
// flag.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <fstream>
#include <string>

#include "io/text/xtml.hpp"
#include "tests/run_helpers.hpp"

namespace text = k3::io::text;
using k3::test::Run;
using k3::test::TempDir;

namespace {

const std::string kModel = std::string(K3_FIXTURES) + "/tiny-k3";
const std::string kTools =
    R"([{"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{"city":{"type":"string"}}}}}])";

Run chat(const std::string& input, const std::string& args) {
  return k3::test::shell(fmt::format("printf '{}' | {} chat {}", input, K3FLOW_BIN, args));
}

}  // namespace

TEST_CASE("chat --tools: the declarations open the conversation; /tool waits for a call") {
  TempDir d;
  std::ofstream(d / "tools.json") << kTools;
  const Run r = chat("/tool 12C\\nWeather?\\n",
                     kModel + " --no-thinking --max-reply 4 --context 2048 --tools " + d / "tools.json");
  INFO(r.err);
  REQUIRE(r.code == 0);
  CHECK(r.err.find("no tool call is waiting for a result") != std::string::npos);
  text::ChatOptions opts(false, "max");
  opts.tools = kTools;
  const size_t prefix = text::join(text::render_prefix(std::nullopt, opts)).size();
  const size_t turn =
      text::join(text::render_turn(text::ChatMessage{text::ChatMessage::Role::user, "Weather?"}, opts))
          .size();
  // The prefix went in when the session started; the turn feeds only itself.
  CHECK(r.err.find(fmt::format("({} prompt ids)", turn)) != std::string::npos);
  // The prefix is the declarations: a context too small for them says how many ids they need.
  const Run small = chat("hi\\n", kModel + " --no-thinking --context 100 --tools " + d / "tools.json");
  CHECK(small.code == 2);
  CHECK(small.err.find(fmt::format("needs {} more positions", prefix)) != std::string::npos);
  CHECK(prefix > kTools.size());
}

TEST_CASE("chat --tools refuses a bad file, a missing one, and --history, with exit 2") {
  TempDir d;
  std::ofstream(d / "bad.json") << R"([{"type":"function","function":{}}])";
  std::ofstream(d / "tools.json") << kTools;
  // "paramters": a misspelt key would declare the function without its arguments; it is named.
  std::ofstream(d / "typo.json") << R"([{"type":"function","function":{"name":"f","paramters":{}}}])";
  for (const std::string& args : {"--tools " + d / "bad.json", "--tools " + d / "none.json",
                                  "--tools " + d / "tools.json" + " --history " + d / "h.jsonl"}) {
    CAPTURE(args);
    const Run r = chat("hi\\n", kModel + " " + args);
    CHECK(r.code == 2);
    CHECK(r.err.find("--tools") != std::string::npos);
  }
  const Run typo = chat("hi\\n", kModel + " --tools " + d / "typo.json");
  CHECK(typo.code == 2);
  CHECK(typo.err.find(fmt::format("--tools {}[0].function: unknown key 'paramters'", d / "typo.json")) !=
        std::string::npos);
}
