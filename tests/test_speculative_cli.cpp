// `k3flow generate --spec N` end to end (the binary) on fixtures/tiny-k3, resident and streamed at
// the floor: the generated ids, step 0's logits dump and the saved K3ST state (KDA state + KV cache
// after the run, so rejected verify rows must have left nothing behind) are the bytes of the plain
// greedy run; the run prints what it drafted and accepted; bad --spec values are usage errors.
#include <doctest/doctest.h>

#include <algorithm>
#include <string>

#include "tests/run_helpers.hpp"

namespace {

const std::string kModel = std::string(K3_FIXTURES) + "/tiny-k3";
// A passage said twice: drafts are found from the first decode step on.
const std::string kPrompt = "17,203,34,2,239,195,88,61,17,203,34,2,239,195,88,61,17,203";

using k3::test::Run;
using k3::test::slurp;
using k3::test::TempDir;

Run run(const std::string& args) {
  return k3::test::k3flow_sh(args + " 2>&1");
}

std::string line_with(const std::string& out, const std::string& what) {
  const size_t at = out.find(what);
  if (at == std::string::npos) return "<no " + what + ">";
  return out.substr(at, out.find('\n', at) - at);
}

}  // namespace

TEST_CASE("generate --spec N: the plain run's ids, logits dump and saved state, resident and streamed") {
  for (const std::string budget : {"", " --preset ultra"}) {
    CAPTURE(budget);
    TempDir d;
    const auto gen = [&](const std::string& name, const std::string& extra) {
      const Run r = run("generate " + kModel + " --ids " + kPrompt + " --gen 30" + budget + extra +
                        " --dump-logits " + d / (name + ".logits") + " --save-state " + d / (name + ".k3st"));
      INFO(r.out);
      REQUIRE(r.code == 0);
      return r.out;
    };
    const std::string plain = gen("plain", "");
    CHECK(plain.find("speculative:") == std::string::npos);
    for (const std::string n : {"1", "3", "8"}) {
      CAPTURE(n);
      const std::string out = gen("spec" + n, " --spec " + n);
      CHECK(line_with(out, "generated ids:") == line_with(plain, "generated ids:"));
      CHECK(slurp(d / ("spec" + n + ".logits")) == slurp(d / "plain.logits"));
      CHECK(slurp(d / ("spec" + n + ".k3st")) == slurp(d / "plain.k3st"));
      const std::string s = line_with(out, "speculative:");
      INFO(s);
      CHECK(s.find("30 tokens") != std::string::npos);
      // The repeats give drafts (the random model rejects them).
      CHECK(s.find(" 0 drafted") == std::string::npos);
    }
    // --spec-oracle: the plain run's answer as drafts, every one accepted; 30 tokens in 1 + 6 passes.
    std::string answer = line_with(plain, "generated ids: ").substr(15);
    std::replace(answer.begin(), answer.end(), ' ', ',');
    const std::string out = gen("oracle", " --spec 4 --spec-oracle " + answer);
    CHECK(line_with(out, "generated ids:") == line_with(plain, "generated ids:"));
    CHECK(slurp(d / "oracle.logits") == slurp(d / "plain.logits"));
    CHECK(slurp(d / "oracle.k3st") == slurp(d / "plain.k3st"));
    CHECK(line_with(out, "speculative:").find("(acceptance 1.00); 7 passes (6 verify) for 30 tokens") !=
          std::string::npos);
  }
}

TEST_CASE("--spec refusals exit 2 naming the flag") {
  for (const std::string bad : {"--spec -1", "--spec 17", "--spec 2 --temperature 0.7",
                                "--spec 2 --recompute", "--spec-oracle 1,2"}) {
    CAPTURE(bad);
    const Run r = run("generate " + kModel + " --ids 1,2,3 --gen 4 " + bad);
    INFO(r.out);
    CHECK(r.code == 2);
    CHECK(r.out.find("--spec") != std::string::npos);
  }
  // --spec 0 is plain decoding.
  CHECK(run("generate " + kModel + " --ids 1,2,3 --gen 4 --spec 0").code == 0);
}

TEST_CASE("chat --spec N: the same replies and the same saved state as plain greedy chat") {
  TempDir d;
  const auto chat = [&](const std::string& name, const std::string& extra) {
    const Run r = k3::test::shell(
        "printf 'Hello there, hello there\\nAnd again: hello there\\n' | " + std::string(K3FLOW_BIN) +
        " chat " + kModel + " --no-thinking --max-reply 24 --context 1024 --save-state " + d / name + extra);
    INFO(r.err);
    REQUIRE(r.code == 0);
    return r;
  };
  const Run plain = chat("plain.k3st", "");
  for (const std::string n : {"1", "4"}) {
    CAPTURE(n);
    const Run spec = chat("spec.k3st", " --spec " + n);
    CHECK(spec.out == plain.out);
    CHECK(slurp(d / "spec.k3st") == slurp(d / "plain.k3st"));
    CHECK(spec.err.find("speculative so far:") != std::string::npos);
  }
  const Run bad = k3::test::shell("printf 'hi\\n' | " + std::string(K3FLOW_BIN) + " chat " + kModel +
                                  " --spec 3 --temperature 0.5");
  CHECK(bad.code == 2);
  CHECK(bad.err.find("--spec") != std::string::npos);
}
