// Memory is never allocated beyond what the model needs (pipeline/graph/planner.cpp caps every pool,
// pipeline/run/streaming_run.cpp decides what a streaming flag without a budget means), on a small
// synthetic checkpoint (`k3flow synth --size small`, ~0.3 GB):
//   - a budget larger than the model (--mem-gb 100) plans every layer pinned, no ring, and exactly
//     one expert slot per routed expert: the same plan as --mem-gb 1000, no larger than the model's
//     weights plus the resident terms (state, scratch, index, process allowances) and each piece's
//     4 KiB alignment; `generate` with it prints that plan and peaks (wait4: the kernel's VmHWM)
//     within it;
//   - --trunk without a budget runs that same everything-resident plan, with a budget of exactly its
//     total;
//   - --strategy without a budget is a usage error (exit 2) naming the flags it needs, for generate
//     and chat, before anything is printed;
//   - no flag at all on a model that does not fit the available memory (K3FLOW_TEST_MEM_AVAILABLE):
//     streamed within 80% of it, not all of it, and the peak stays within that;
//   - a budget that is not a positive number of GiB is one line naming the flag.
#include <doctest/doctest.h>
#include <fmt/format.h>
#include <simdjson.h>

#include <algorithm>
#include <filesystem>
#include <string>

#include "io/config.hpp"
#include "io/safetensors.hpp"
#include "tests/plan_table.hpp"
#include "tests/run_helpers.hpp"

namespace fs = std::filesystem;
using k3::test::Run;
using k3::test::slurp;
using k3::test::TempDir;

using k3::test::plan_table;

namespace {

Run k3flow(const std::string& args) {
  return k3::test::k3flow_sh(args);
}

Run k3flow_env(const std::string& args, const std::string& env) {
  return k3::test::k3flow_sh(args, env);
}

struct Small {
  TempDir dir;
  std::string model, trunk;
  Small() {
    model = dir / "small";
    trunk = dir / "trunk";
    const Run s = k3flow(fmt::format("synth {} --size small --seed 2", model));
    REQUIRE_MESSAGE(s.code == 0, s.err);
    const Run p = k3flow(fmt::format("pack-trunk {} {}", model, trunk));
    REQUIRE_MESSAGE(p.code == 0, p.err);
  }
};

Small& small() {
  static Small s;
  return s;
}

uint64_t u(simdjson::dom::element e) {
  return uint64_t(e);
}

// Every pool of a plan JSON but the budget-dependent lines, to compare two plans.
std::string pools(simdjson::dom::element plan) {
  return simdjson::minify(plan["pools"]) + simdjson::minify(plan["trunk"]) +
         simdjson::minify(plan["experts"]);
}

}  // namespace

TEST_CASE("a budget larger than the model plans, and allocates, no more than the model needs") {
  const Small& s = small();
  const k3::io::ModelConfig c = k3::io::load_config(fs::path(s.model) / "config.json");
  const k3::io::ShardSet shards = k3::io::ShardSet::open(s.model);
  uint64_t weights = 0;
  shards.for_each([&](std::string_view, const k3::io::TensorInfo& t) { weights += t.nbytes; });
  // The embedding stays in the checkpoint, read a row per id (stages::EmbedRows): the pools hold
  // every other byte of it.
  const std::optional<k3::io::TensorInfo> embed = shards.find("language_model.model.embed_tokens.weight");
  REQUIRE(embed.has_value());
  REQUIRE(embed->dtype == k3::io::DType::BF16);
  weights -= embed->nbytes;
  int moe_layers = 0;
  for (int l = 0; l < c.n_layers; ++l) moe_layers += c.is_dense(l) ? 0 : 1;
  const uint64_t routed = uint64_t(moe_layers) * uint64_t(c.n_experts);

  simdjson::dom::parser p100, p1000;
  const Run r100 = k3flow(fmt::format("plan {} --mem-gb 100 --context 6 --json", s.model));
  const Run r1000 = k3flow(fmt::format("plan {} --mem-gb 1000 --context 6 --json", s.model));
  REQUIRE_MESSAGE(r100.code == 0, r100.err);
  REQUIRE_MESSAGE(r1000.code == 0, r1000.err);
  const simdjson::dom::element a = p100.parse(r100.out), b = p1000.parse(r1000.out);
  CHECK(pools(a) == pools(b));
  CHECK(u(a["total"]) == u(b["total"]));
  CHECK(a["trunk"]["pinned"].get_array().size() == size_t(c.n_layers));
  CHECK(u(a["trunk"]["ring_slots"]) == 0);
  CHECK(u(a["trunk"]["streamed_bytes"]) == 0);
  CHECK(u(a["experts"]["inflight"]) + u(a["experts"]["lookahead"]) + u(a["experts"]["cache"]) == routed);

  // The weights' pools (head, pinned layers, expert slots) hold the checkpoint's bytes, each piece
  // rounded up to 4 KiB with one more page per expert slot (the enclosing read window) and the f32
  // area the binder widens vectors into; everything else is the named resident terms.
  uint64_t weight_pools = 0, other = 0, widen_allowance = 0;
  for (simdjson::dom::element pool : a["pools"].get_array()) {
    const std::string_view name = pool["name"];
    const bool weight =
        name.starts_with("lm_head") || name.starts_with("pinned") || name.starts_with("expert");
    (weight ? weight_pools : other) += u(pool["bytes"]);
  }
  const uint64_t pieces = uint64_t(c.n_layers) + routed + 1;
  widen_allowance = 4 * uint64_t(c.hidden) * 16 * uint64_t(c.n_layers + 1);  // norm gains etc., widened
  MESSAGE(fmt::format("weights {} B; weight pools {} B ({} pieces); other terms {} B; total {} B", weights,
                      weight_pools, pieces, other, u(a["total"])));
  CHECK(weight_pools >= weights);
  CHECK(weight_pools <= weights + pieces * 2 * 4096 + widen_allowance);
  CHECK(u(a["total"]) == weight_pools + other);

  // The text plan says the rest of the budget is left unallocated.
  const Run text = k3flow(fmt::format("plan {} --mem-gb 100 --context 6", s.model));
  REQUIRE(text.code == 0);
  CHECK(text.out.find("left unallocated") != std::string::npos);

  // generate with the same budget prints the same plan and its peak RSS stays within it.
  TempDir d;
  const Run g = k3flow(
      fmt::format("generate {} --ids 1,2,3 --gen 2 --mem-gb 100 --out {} 2>&1", s.model, d / "r.json"));
  REQUIRE_MESSAGE(g.code == 0, g.out);
  K3_CHECK_UNLESS_SANITIZED(plan_table(g.out) == text.out);
  MESSAGE(
      fmt::format("generate --mem-gb 100: plan total {} B, child peak RSS {} B", u(a["total"]), g.peak_rss));
#if defined(__SANITIZE_ADDRESS__) || defined(K3_SANITIZED)
  MESSAGE("AddressSanitizer build: shadow memory inflates RSS, the peak check is skipped");
#else
  CHECK(g.peak_rss <= u(a["total"]));
#endif
}

TEST_CASE("--trunk without a budget: everything resident, a budget of exactly what that needs") {
  const Small& s = small();
  TempDir d;
  const Run g = k3flow(fmt::format("generate {} --ids 1,2,3 --gen 2 --trunk {} --out {} 2>&1", s.model,
                                   s.trunk, d / "r.json"));
  REQUIRE_MESSAGE(g.code == 0, g.out);
  CHECK(g.out.find("--trunk without a budget") != std::string::npos);
  const std::string table = plan_table(g.out);
  const size_t un = table.find("  unassigned ");
  REQUIRE(un != std::string::npos);
  CHECK(table.substr(un, table.find('\n', un) - un).ends_with(" 0 B"));  // a budget of exactly the plan
  simdjson::dom::parser parser;
  const simdjson::dom::element report = parser.parse(slurp(d / "r.json"));
  const Run p = k3flow(fmt::format("plan {} --trunk {} --mem-gb 100 --context 6 --json", s.model, s.trunk));
  REQUIRE_MESSAGE(p.code == 0, p.err);
  simdjson::dom::parser pp;
  const simdjson::dom::element plan = pp.parse(p.out);
  K3_CHECK_UNLESS_SANITIZED(u(report["budget_bytes"]) == u(plan["total"]));
#if !defined(__SANITIZE_ADDRESS__) && !defined(K3_SANITIZED)
  CHECK(g.peak_rss <= u(plan["total"]));
#endif
}

TEST_CASE("--strategy without a budget is a usage error naming the flags it needs") {
  const Small& s = small();
  TempDir d;
  for (const char* cmd : {"generate {} --ids 1,2,3 --gen 2 --strategy serial --out {}",
                          "generate {} --prompt hi --gen 2 --strategy lookahead --out {}"}) {
    const Run g = k3flow(fmt::format(fmt::runtime(cmd), s.model, d / "r.json"));
    CAPTURE(cmd);
    CHECK(g.code == 2);
    CHECK(g.out.empty());
    CHECK(g.err.find("--strategy needs a budget") != std::string::npos);
    CHECK(g.err.find("--mem-gb") != std::string::npos);
    CHECK(!fs::exists(d / "r.json"));
  }
  const Run chat =
      k3::test::shell(fmt::format("printf 'hi\\n' | {} chat {} --strategy serial", K3FLOW_BIN, s.model));
  CHECK(chat.code == 2);
  CHECK(chat.err.find("--strategy needs a budget") != std::string::npos);
}

TEST_CASE("no budget flag, a model larger than the available memory: streamed within 80% of it") {
  const Small& s = small();
  const k3::io::ShardSet shards = k3::io::ShardSet::open(s.model);
  uint64_t weights = 0;
  shards.for_each([&](std::string_view, const k3::io::TensorInfo& t) { weights += t.nbytes; });
  const uint64_t avail = weights / 2;  // the machine "has" half the model
  TempDir d;
  const Run g = k3flow_env(fmt::format("generate {} --ids 1,2,3 --gen 2 --out {}", s.model, d / "r.json"),
                           fmt::format("K3FLOW_TEST_MEM_AVAILABLE={}", avail));
  REQUIRE_MESSAGE(g.code == 0, g.err);
  CHECK(g.out.find("do not fit in the memory available") != std::string::npos);
  CHECK(g.out.find("streaming within 80% of it") != std::string::npos);
  simdjson::dom::parser p;
  const simdjson::dom::element report = p.parse(slurp(d / "r.json"));
  const uint64_t budget = u(report["budget_bytes"]);
  MESSAGE(fmt::format("available {} B, budget {} B, peak RSS {} B", avail, budget, g.peak_rss));
  CHECK(budget <= avail * 8 / 10 + 1);
  CHECK(budget >= avail * 8 / 10 - (uint64_t{1} << 20));
#if defined(__SANITIZE_ADDRESS__) || defined(K3_SANITIZED)
  MESSAGE("AddressSanitizer build: shadow memory inflates RSS, the peak check is skipped");
#else
  CHECK(g.peak_rss <= budget);
#endif
}

TEST_CASE("a budget that is not a positive number of GiB is one line naming the flag") {
  const Small& s = small();
  for (const char* v : {"-1", "0", "nan", "inf", "1e400", "2x"}) {
    for (const char* cmd : {"generate {} --ids 1 --gen 1 --mem-gb {}", "plan {} --mem-gb {}"}) {
      const Run r = k3flow(fmt::format(fmt::runtime(cmd), s.model, v));
      CAPTURE(cmd);
      CAPTURE(v);
      CHECK(r.code == 2);
      CHECK(r.err.find("--mem-gb") != std::string::npos);
      CHECK(r.err.find("not a size in GiB") != std::string::npos);
      CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
      CHECK(r.err.size() < 200);
    }
  }
}
