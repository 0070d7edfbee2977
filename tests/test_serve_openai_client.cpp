// `k3flow serve` with the official `openai` npm client: tests/openai_client/serve_e2e.mjs runs
// models.list, models.retrieve, completions and chat (streamed and not), logprobs, a JSON schema
// response_format, a tool round trip (assistant tool_calls + a tool message), a refused unknown
// field and a wrong API key against a real server on loopback, and checks the completion ids
// against `k3flow generate`'s for the same prompt, and the chat reply's ids against `generate --ids`'s
// for the rendered conversation. It needs node and the pinned package (`npm ci` in
// tests/openai_client/, which .ci/install-deps runs); without them the test says so and skips.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include "io/text/xtml.hpp"
#include "pipeline/run/decoder.hpp"
#include "pipeline/run/model_tokenizer.hpp"
#include "tests/run_helpers.hpp"
#include "tests/test_serve_client.hpp"

using namespace k3::test;

namespace {

const std::string kTiny = std::string(K3_FIXTURES) + "/tiny-k3";
const std::string kClientDir = std::string(K3_SOURCE_DIR) + "/tests/openai_client";

// The greedy ids of `k3flow generate` for `prompt`, comma-separated.
std::string generate_ids(const std::string& prompt, int gen) {
  const Run r = k3flow(
      fmt::format("generate {} --prompt {} --gen {} --print-ids --no-progress", kTiny, prompt, gen), "", 120);
  REQUIRE_MESSAGE(r.code == 0, r.err);
  const size_t at = r.out.rfind("\nids:");
  REQUIRE(at != std::string::npos);
  std::istringstream in(r.out.substr(at + 5));
  std::string ids;
  for (int id; in >> id;) ids += (ids.empty() ? "" : ",") + std::to_string(id);
  return ids;
}

// The greedy ids `k3flow generate --ids` gives for the XTML render (thinking off) of the script's
// chatMessages: what the chat reply must be.
std::string chat_ids(int gen) {
  namespace text = k3::io::text;
  using Role = text::ChatMessage::Role;
  const k3::io::ModelConfig cfg = k3::pipeline::load_model_config(kTiny, std::nullopt);
  const text::Tokenizer tok = *k3::pipeline::model_tokenizer(kTiny, std::nullopt, cfg, "--prompt");
  const std::vector<text::ChatMessage> msgs = {{Role::system, "Be brief."}, {Role::user, "Name a colour."}};
  std::string prompt;
  for (const text::Segment& s : text::render(msgs, true, text::ChatOptions(false, "max")))
    for (int32_t id : tok.encode(s.text, s.control))
      prompt += (prompt.empty() ? "" : ",") + std::to_string(id);
  const Run r =
      k3flow(fmt::format("generate {} --ids {} --gen {} --no-progress", kTiny, prompt, gen), "", 120);
  REQUIRE_MESSAGE(r.code == 0, r.err);
  const size_t at = r.out.rfind("generated ids:");
  REQUIRE(at != std::string::npos);
  std::istringstream in(r.out.substr(at + 14, r.out.find('\n', at) - at - 14));
  std::string ids;
  for (int id; in >> id;) ids += (ids.empty() ? "" : ",") + std::to_string(id);
  return ids;
}

bool client_installed() {
  if (shell("command -v node").code != 0) {
    MESSAGE("skipped: node is not installed (.ci/install-deps installs it)");
    return false;
  }
  if (!std::filesystem::exists(kClientDir + "/node_modules/openai/package.json")) {
    MESSAGE(
        "skipped: the openai package is not installed (npm ci in tests/openai_client, as .ci/install-deps "
        "does)");
    return false;
  }
  return true;
}

std::string run_client(int port, const std::string& expect_ids, const std::string& expect_chat_ids) {
  const Run r = shell(fmt::format("K3FLOW_MODEL=tiny-k3 K3FLOW_API_KEY=sekrit K3FLOW_PROMPT=Hello "
                                  "K3FLOW_MAX_TOKENS=12 K3FLOW_EXPECT_IDS={} K3FLOW_EXPECT_CHAT_IDS={} node "
                                  "{}/serve_e2e.mjs http://127.0.0.1:{}/v1",
                                  expect_ids, expect_chat_ids, kClientDir, port),
                      120);
  return fmt::format("exit {}\n{}{}", r.code, r.out, r.err);
}

}  // namespace

TEST_CASE(
    "the official openai client: models, completions and chat, streamed and not, logprobs, JSON output, a "
    "tool round trip; completion and chat ids equal generate's") {
  if (!client_installed()) return;
  const std::string ids = generate_ids("Hello", 12);
  const std::string chat = chat_ids(8);
  ServeChild s(kTiny + " --api-key sekrit");
  const std::string got = run_client(s.port(), ids, chat);
  CHECK_MESSAGE(got.rfind("exit 0\n", 0) == 0, got);
  for (const char* name :
       {"modelsList", "modelsRetrieve", "completion", "completionStream", "chat", "chatIds", "chatStream",
        "chatLogprobs", "completionLogprobs", "jsonSchema", "toolResult", "unknownFieldRefused", "wrongKey"})
    CHECK_MESSAGE(got.find(fmt::format("ok {}\n", name)) != std::string::npos, name << "\n" << got);
  // The script can fail: other expected ids are refused by the two completion cases and the chat one.
  const std::string wrong =
      run_client(s.port(), ids.substr(0, ids.rfind(',')), chat.substr(0, chat.rfind(',')));
  CHECK_MESSAGE(wrong.rfind("exit 1\n", 0) == 0, wrong);
  CHECK(wrong.find("FAIL completion:") != std::string::npos);
  CHECK(wrong.find("FAIL completionStream:") != std::string::npos);
  CHECK(wrong.find("FAIL chatIds:") != std::string::npos);
  CHECK(s.stop(SIGTERM) == 0);
}
