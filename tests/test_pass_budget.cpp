// The budget holds for every pass size (issue 15): the plan's activation terms are sized for its
// pass rows (`pass_rows` in plan --json, "activation scratch (N-row pass)" in the table) from the
// very layout CallBuffers::prepare carves, and the engine never feeds a pass of more rows -- a long
// prompt is split into passes (generate's Decoder as BatchEngine), bit-identically. Real children
// (k3flow) at the plan floor of a `small` synthetic, their peak RSS (wait4) against the budget.
#include <doctest/doctest.h>
#include <fmt/format.h>
#include <simdjson.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <string>

#include "io/config.hpp"
#include "pipeline/graph/call_buffers.hpp"
#include "pipeline/graph/planner.hpp"
#include "tests/generate_helpers.hpp"
#include "tests/run_helpers.hpp"

namespace fs = std::filesystem;
using k3::test::k3flow;
using k3::test::Run;
using k3::test::TempDir;

namespace {

struct Small {
  TempDir dir;
  std::string model;
  Small() {
    model = dir / "small";
    const Run s = k3flow(fmt::format("synth {} --size small --seed 2", model));
    REQUIRE_MESSAGE(s.code == 0, s.err);
  }
};

Small& small() {
  static Small s;
  return s;
}

struct Plan {
  simdjson::dom::parser parser;
  simdjson::dom::element doc;
  uint64_t u(const char* a, const char* b = nullptr) {
    return b ? uint64_t(doc[a][b].get_uint64()) : uint64_t(doc[a].get_uint64());
  }
  // The bytes of the pool whose name starts with `prefix` (REQUIREs exactly one).
  uint64_t pool(const std::string& prefix, std::string* name = nullptr) {
    uint64_t bytes = 0;
    int found = 0;
    for (simdjson::dom::element p : doc["pools"].get_array()) {
      const std::string n{std::string_view(p["name"])};
      if (n.rfind(prefix, 0) != 0) continue;
      ++found;
      bytes = uint64_t(p["bytes"].get_uint64());
      if (name) *name = n;
    }
    REQUIRE_MESSAGE(found == 1, prefix);
    return bytes;
  }
};

void plan_json(Plan& p, const std::string& args) {
  const Run r = k3flow("plan " + small().model + " " + args + " --json");
  REQUIRE_MESSAGE(r.code == 0, r.err);
  REQUIRE(p.parser.parse(r.out).get(p.doc) == simdjson::SUCCESS);
}

// --mem-gb for exactly `bytes` (GiB to 9 decimals, rounded up) and the bytes it means.
std::pair<std::string, uint64_t> gib(uint64_t bytes) {
  const double gb = std::ceil(double(bytes) / double(1 << 30) * 1e9) / 1e9;
  return {fmt::format("{:.9f}", gb), uint64_t(std::llround(gb * double(1 << 30)))};
}

// `n` prompt ids, none repeating soon (the small synthetic's vocabulary is larger than 2000).
std::string prompt_ids(int n) {
  std::string s;
  for (int i = 0; i < n; ++i) s += fmt::format("{}{}", i ? "," : "", 3 + (i * 37) % 1997);
  return s;
}

}  // namespace

TEST_CASE(
    "plan --json: the activation scratch term is what CallBuffers::prepare allocates for its pass rows") {
  const k3::io::ModelConfig c = k3::io::load_config(fs::path(small().model) / "config.json");
  // One sequence with a short context (a pass of all of it), a long one (64-row passes), and a
  // batch whose single ids outnumber 64 would not fit a 64-row pass... 80 sequences do.
  struct Case {
    uint64_t context;
    int seqs;
    uint64_t rows;
  };
  for (const Case k : {Case{20, 1, 20}, Case{300, 1, 64}, Case{300, 4, 64}, Case{300, 80, 80}}) {
    CAPTURE(k.context);
    CAPTURE(k.seqs);
    Plan p;
    plan_json(p, fmt::format("--mem-gb 2 --context {} --max-seqs {}", k.context, k.seqs));
    CHECK(p.u("sequences", "pass_rows") == k.rows);
    std::string name;
    const uint64_t planned = p.pool("activation scratch", &name);
    CHECK(name == fmt::format("activation scratch ({}-row pass)", k.rows));
    k3::pipeline::CallBuffers buf;
    buf.prepare(c, size_t(k.rows), size_t(k.context), true, size_t(k.seqs));
    MESSAGE(fmt::format("context {}, {} sequences: {}-row pass, planned {} B, CallBuffers {} B", k.context,
                        k.seqs, k.rows, planned, buf.bytes()));
    CHECK(planned == buf.bytes());
    CHECK(buf.bytes() ==
          k3::pipeline::call_buffer_bytes(c, size_t(k.rows), size_t(k.context), true, size_t(k.seqs)));
    // A smaller pass after it needs no more: the buffer never grows past the planned figure.
    buf.prepare(c, 1, size_t(k.context), true, 1);
    CHECK(buf.bytes() == planned);
  }
}

TEST_CASE(
    "generate with a 130-id prompt at the plan floor: 64-row passes, peak RSS under the budget, the "
    "resident run's ids") {
  Small& s = small();
  const int n = 130, gen = 3;
  const std::string ids = prompt_ids(n);
  Plan p;
  plan_json(p, fmt::format("--mem-gb 64 --context {}", n + gen + 1));
  CHECK(p.u("sequences", "pass_rows") == 64);
  const auto [gb, budget] = gib(p.u("floor"));
  TempDir d;
  // The reference: resident, the whole prompt in one pass.
  const k3::test::Output resident = k3::test::generate(s.model, ids, fmt::format("--gen {}", gen), d);
  CHECK(resident.out.find("streaming:") == std::string::npos);
  const Run r = k3flow(fmt::format("generate {} --ids {} --gen {} --mem-gb {} --dump-logits {} --out {}",
                                   s.model, ids, gen, gb, d / "streamed.bin", d / "streamed.json"),
                       "", k3::test::kSanitized ? 240 : 120);
  REQUIRE_MESSAGE(r.code == 0, std::string(r.out + r.err));
  K3_CHECK_UNLESS_SANITIZED(r.out.find("WARNING") == std::string::npos);  // planned with the process terms
  CHECK(r.out.find("activation scratch (64-row pass)") != std::string::npos);
  // Prefilled in passes of 64, 64 and 2 ids: the prompt's last logits are the whole pass's bytes
  // (--dump-logits: step 0's row of the 8192-id vocabulary), and so are the ids.
  CHECK(k3::test::slurp(d / "streamed.bin") == resident.logits);
  CHECK(resident.logits.size() == 4 * 8192);
  CHECK(k3::test::field(k3::test::slurp(d / "streamed.json"), "generated_ids") == resident.ids);
  MESSAGE(fmt::format("{}-id prompt at the floor {} B: child peak RSS {} B ({:+.2f} MiB)", n, budget,
                      r.peak_rss, (double(r.peak_rss) - double(budget)) / double(1 << 20)));
  K3_CHECK_UNLESS_SANITIZED(r.peak_rss <= budget);
}

TEST_CASE("bench --batch-child 4 with a 130-id prompt joining at the plan floor: peak RSS under the budget") {
  Small& s = small();
  const int B = 4, join = 130, gen = 3;
  // The child's positions per sequence: max(prompt + warm-up + join steps + gen, join + gen + 1).
  Plan p;
  plan_json(p, fmt::format("--mem-gb 64 --context {} --max-seqs {}", join + gen + 1, B));
  CHECK(p.u("sequences", "pass_rows") == 64);
  const auto [gb, budget] = gib(p.u("floor"));
  const Run r = k3flow(fmt::format("bench {} --mem-gb {} --gen {} --ids 7,8,9 --strategy overlap "
                                   "--batch-child {} --join {} --prefill inline --prefill-chunk 0",
                                   s.model, gb, gen, B, join),
                       "", k3::test::kSanitized ? 240 : 120);
  REQUIRE_MESSAGE(r.code == 0, std::string(r.out + r.err));
  K3_CHECK_UNLESS_SANITIZED(r.out.find("WARNING") == std::string::npos);
  CHECK(r.out.find("activation scratch (64-row pass)") != std::string::npos);
  CHECK(r.out.find("\nJOIN ") != std::string::npos);
  MESSAGE(fmt::format(
      "{} sequences, a {}-id prompt joining, at the floor {} B: child peak RSS {} B ({:+.2f} MiB)", B, join,
      budget, r.peak_rss, (double(r.peak_rss) - double(budget)) / double(1 << 20)));
  K3_CHECK_UNLESS_SANITIZED(r.peak_rss <= budget);
}

TEST_CASE(
    "a budget between the bare floor and floor + the process's own terms: one WARNING, the least overrun") {
  Small& s = small();
  const int gen = 3;
  Plan p;
  plan_json(p, fmt::format("--mem-gb 64 --context {}", 3 + gen + 1));
  const uint64_t floor = p.u("floor");  // with the process allowances: what the run needs
  const auto [gb, budget] = gib(floor - (uint64_t{1} << 20));
  const Run r = k3flow(fmt::format("generate {} --ids 7,8,9 --gen {} --mem-gb {}", s.model, gen, gb), "",
                       k3::test::kSanitized ? 240 : 120);
  REQUIRE_MESSAGE(r.code == 0, std::string(r.out + r.err));
  INFO(r.out);
  // The warning names how far over the run will go and the --mem-gb that would hold.
  const size_t w = r.out.find("WARNING: budget");
  REQUIRE(w != std::string::npos);
  const std::string line = r.out.substr(w, r.out.find('\n', w) - w);
  CHECK(line.find("peak RSS will exceed the budget by about") != std::string::npos);
  const size_t at = line.find("(--mem-gb ");
  REQUIRE(at != std::string::npos);
  const double holds = std::stod(line.substr(at + 10));
  CHECK(uint64_t(holds * double(1 << 30)) >= floor - (uint64_t{1} << 20));  // rounded to 0.001 GiB
  // Planned at the floor without the process terms, so the whole process is over the budget by about
  // the 1 MiB it lacks, not by the process's ~18 MiB (as when the budget was filled without them).
  MESSAGE(fmt::format("budget {} B (floor {} B - 1 MiB): child peak RSS {} B", budget, floor, r.peak_rss));
  K3_CHECK_UNLESS_SANITIZED(r.peak_rss <= floor + (uint64_t{2} << 20));
}
