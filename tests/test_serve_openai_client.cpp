// `k3flow serve` with the official `openai` npm client: tests/openai_client/serve_e2e.mjs runs
// models.list, models.retrieve, completions and chat (streamed and not), logprobs, a JSON schema
// response_format, a tool round trip (assistant tool_calls + a tool message), a refused unknown
// field and a wrong API key against a real server on loopback, and checks the completion ids
// against `k3flow generate`'s for the same prompt. It needs node and the pinned package (`npm ci` in
// tests/openai_client/, which .ci/install-deps runs); without them the test says so and skips.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <filesystem>
#include <sstream>
#include <string>

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

std::string run_client(int port, const std::string& expect_ids) {
  const Run r = shell(fmt::format("K3FLOW_MODEL=tiny-k3 K3FLOW_API_KEY=sekrit K3FLOW_PROMPT=Hello "
                                  "K3FLOW_MAX_TOKENS=12 K3FLOW_EXPECT_IDS={} node {}/serve_e2e.mjs "
                                  "http://127.0.0.1:{}/v1",
                                  expect_ids, kClientDir, port),
                      120);
  return fmt::format("exit {}\n{}{}", r.code, r.out, r.err);
}

}  // namespace

TEST_CASE(
    "the official openai client: models, completions and chat, streamed and not, logprobs, JSON output, a "
    "tool round trip; ids equal generate's") {
  if (!client_installed()) return;
  const std::string ids = generate_ids("Hello", 12);
  ServeChild s(kTiny + " --api-key sekrit");
  const std::string got = run_client(s.port(), ids);
  CHECK_MESSAGE(got.rfind("exit 0\n", 0) == 0, got);
  for (const char* name :
       {"modelsList", "modelsRetrieve", "completion", "completionStream", "chat", "chatStream",
        "chatLogprobs", "completionLogprobs", "jsonSchema", "toolResult", "unknownFieldRefused", "wrongKey"})
    CHECK_MESSAGE(got.find(fmt::format("ok {}\n", name)) != std::string::npos, name << "\n" << got);
  // The script can fail: other expected ids are refused by the two completion cases.
  const std::string wrong = run_client(s.port(), ids.substr(0, ids.rfind(',')));
  CHECK_MESSAGE(wrong.rfind("exit 1\n", 0) == 0, wrong);
  CHECK(wrong.find("FAIL completion:") != std::string::npos);
  CHECK(wrong.find("FAIL completionStream:") != std::string::npos);
  CHECK(s.stop(SIGTERM) == 0);
}
