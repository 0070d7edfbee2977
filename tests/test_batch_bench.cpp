// Batched decode through the real binary (K3FLOW_BIN): `k3flow plan --max-seqs N` holds N
// sequences' carried state and says so per sequence; `k3flow bench --batch` runs B sequences in one
// engine per child, and a child with 4 sequences on a checkpoint over 3x its budget keeps its peak
// RSS (wait4) under the budget; every sequence emits the ids it emits in a batch of one. `bench
// --batch B --join N` compares the prefill modes for a prompt joining B - 1 decoding sequences, with
// the same ids in every mode. Both write their results as JSON with --json / --out; `--batch
// --trace-dir` a Chrome trace per run whose compute spans carry the rows of the batched step.
#include <doctest/doctest.h>
#include <fmt/format.h>
#include <simdjson.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>

#include "tests/run_helpers.hpp"

namespace fs = std::filesystem;
using k3::test::k3flow;
using k3::test::Run;
using k3::test::TempDir;

namespace {

struct Small {
  TempDir dir;
  std::string model;
  uint64_t on_disk = 0;
  Small() {
    model = dir / "small";
    const Run s = k3flow(fmt::format("synth {} --size small --seed 2", model));
    REQUIRE_MESSAGE(s.code == 0, s.err);
    for (const auto& e : fs::directory_iterator(model)) on_disk += fs::file_size(e.path());
  }
};

Small& small() {
  static Small s;
  return s;
}

// The value after `key=` on the BATCH (or JOIN) line.
std::string batch_field(const std::string& out, const std::string& key, const std::string& tag = "BATCH") {
  const size_t line = out.rfind("\n" + tag + " ");
  if (line == std::string::npos) return "<no " + tag + " line>";
  const size_t at = out.find(" " + key + "=", line);
  if (at == std::string::npos) return "<no " + key + ">";
  const size_t b = at + key.size() + 2, e = out.find_first_of(" \n", b);
  return out.substr(b, e - b);
}

// A bench's --json output: one JSON object whose mode is `mode`.
simdjson::dom::element results(simdjson::dom::parser& parser, const std::string& out, std::string_view mode) {
  simdjson::dom::element doc;
  REQUIRE_MESSAGE(parser.parse(out).get(doc) == simdjson::SUCCESS, out);
  CHECK(std::string_view(doc["mode"]) == mode);
  return doc;
}

}  // namespace

TEST_CASE("plan --max-seqs: the carried state of every sequence is planned, and printed per sequence") {
  Small& s = small();
  const Run one = k3flow(fmt::format("plan {} --mem-gb 0.2 --context 64", s.model));
  const Run four = k3flow(fmt::format("plan {} --mem-gb 0.2 --context 64 --max-seqs 4", s.model));
  REQUIRE_MESSAGE(one.code == 0, one.err);
  REQUIRE_MESSAGE(four.code == 0, four.err);
  CHECK(one.out.find("x 1 sequence =") != std::string::npos);
  CHECK(four.out.find("x 4 sequences =") != std::string::npos);
  CHECK(four.out.find("MLA KV cache (64 positions x 4 sequences") != std::string::npos);
  CHECK(one.out.find("sequences") == std::string::npos);
  // A step of four sequences routes up to four sequences' experts a layer at once: the expert reader
  // may deepen to four chunks in flight per sequence (pipeline/graph/reader_options.cpp), its ring
  // planned for the deepest window.
  CHECK_MESSAGE(one.out.find("expert reads: 4 x ") != std::string::npos, one.out);
  CHECK_MESSAGE(four.out.find("expert reads: 4-16 (adaptive) x ") != std::string::npos, four.out);
  // What the three other sequences displace, against the one-sequence plan printed above.
  CHECK(one.out.find("against 1 sequence") == std::string::npos);
  const auto pinned = [](const std::string& out) {
    const size_t at = out.find("pinned trunk layers (");
    return at == std::string::npos ? std::string("none")
                                   : out.substr(at + 21, out.find(' ', at + 21) - at - 21);
  };
  const auto read = [](const std::string& out) {
    const size_t at = out.find("trunk read per token: ");
    REQUIRE(at != std::string::npos);
    return out.substr(at + 22, out.find(" of ", at) - at - 22);
  };
  CHECK_MESSAGE(four.out.find(fmt::format("leaves {} of {} pinned trunk layers", pinned(four.out),
                                          pinned(one.out))) != std::string::npos,
                four.out);
  CHECK_MESSAGE(four.out.find(fmt::format("trunk read per step {} -> {}\n", read(one.out), read(four.out))) !=
                    std::string::npos,
                four.out);
  const Run j1 = k3flow(fmt::format("plan {} --mem-gb 0.2 --context 64 --json", s.model));
  const Run j4 = k3flow(fmt::format("plan {} --mem-gb 0.2 --context 64 --max-seqs 4 --json", s.model));
  REQUIRE(j1.code == 0);
  REQUIRE(j4.code == 0);
  const auto num = [](const std::string& json, const std::string& key) {
    const size_t at = json.find("\"" + key + "\":");
    REQUIRE(at != std::string::npos);
    return std::strtoull(json.c_str() + at + key.size() + 3, nullptr, 10);
  };
  const uint64_t per = num(j4.out, "state_bytes_per_sequence");
  CHECK(per == num(j1.out, "state_bytes_per_sequence"));
  CHECK(num(j4.out, "max_seqs") == 4);
  // The planned total grows by three more sequences' state (the scratch is sized for 64 rows both
  // times); the pools shrink by as much, so the total stays within the same budget.
  CHECK(num(j4.out, "budget") == num(j1.out, "budget"));
  const Run bad = k3flow(fmt::format("plan {} --mem-gb 0.2 --max-seqs 0", s.model));
  CHECK(bad.code == 2);
}

TEST_CASE("bench --batch child: 4 sequences on a checkpoint over 3x the budget stay under it, same ids") {
  Small& s = small();
  // 0.075 GiB: 3.5 MiB over the floor, so the plan pins no layer and streams all 6 through a 2-slot
  // ring. A sanitized process is larger than the process allowance: its plan is made at the floor
  // without that term (plan_run's "planned at its floor" warning), which streams every layer too.
  const double gb = 0.075;
  const uint64_t budget = uint64_t(std::llround(gb * (1 << 30)));
  REQUIRE(s.on_disk >= 3 * budget);
  const std::string common =
      fmt::format("bench {} --mem-gb {} --gen 4 --ids 7,8,9 --strategy overlap", s.model, gb);
  const Run b1 = k3flow(common + " --batch-child 1", "", 180);
  const Run b4 = k3flow(common + " --batch-child 4", "", 180);
  REQUIRE_MESSAGE(b1.code == 0, b1.err);
  REQUIRE_MESSAGE(b4.code == 0, b4.err);
  MESSAGE(fmt::format("small ({} MB on disk) at --mem-gb {} ({} B): peak RSS B=1 {} B, B=4 {} B",
                      s.on_disk / 1000000, gb, budget, b1.peak_rss, b4.peak_rss));
  K3_CHECK_UNLESS_SANITIZED(b1.peak_rss <= budget);
  K3_CHECK_UNLESS_SANITIZED(b4.peak_rss <= budget);
  const std::string ids1 = batch_field(b1.out, "ids"), ids4 = batch_field(b4.out, "ids");
  CHECK(ids4.substr(0, ids4.find('/')) == ids1);
  CHECK(std::count(ids4.begin(), ids4.end(), '/') == 3);
  // One pass per step: the trunk read over the decode steps does not grow with the sequences (a
  // pass per row would read it 4x). Not equal: the ring reads ahead into the next step, and how
  // much of that lands inside the measured steps depends on timing (up to ~1.3x seen at load 14).
  const double t1 = std::stod(batch_field(b1.out, "trunk")), t4 = std::stod(batch_field(b4.out, "trunk"));
  const std::string why =
      "the plan at this budget holds the whole trunk: no decode step reads it, so this case tests "
      "nothing (lower the budget)\n" +
      b1.out;
  REQUIRE_MESSAGE(t1 > 0, why);
  CHECK(t4 < 2 * t1);
}

TEST_CASE(
    "bench --batch: the table, every batch size, the same ids, its JSON, its traces; bad lists refused") {
  Small& s = small();
  TempDir d;
  const std::string out = d / "batch.json", traces = d / "traces";
  // --json: the JSON alone on stdout, the text on stderr; --out: the same document in a file.
  const Run r = k3flow(fmt::format("bench {} --mem-gb 0.09 --gen 3 --ids 7,8,9 --repeat 1 --batch 1,2 --json "
                                   "--out {} --trace-dir {}",
                                   s.model, out, traces),
                       "", 300);
  REQUIRE_MESSAGE(r.code == 0, r.err);
  CHECK(r.err.find("agg tok/s med") != std::string::npos);
  CHECK(r.err.find("every sequence emitted the same ids at every B") != std::string::npos);
  CHECK(k3::test::slurp(out) == r.out);
  simdjson::dom::parser parser;
  const simdjson::dom::element doc = results(parser, r.out, "batch");
  CHECK(int64_t(doc["decode_steps"]) == 2);
  simdjson::dom::array rows = doc["batches"];
  REQUIRE(rows.size() == 2);
  int64_t b = 0;
  for (simdjson::dom::element row : rows) {
    CHECK(int64_t(row["batch"]) == ++b);
    const double sps = row["s_per_step"];
    CHECK(sps > 0);
    // Aggregate tokens/s is B over the median s/step, as the table prints it.
    CHECK(double(row["tokens_per_s"]) == doctest::Approx(double(b) / sps));
    CHECK(simdjson::dom::array(row["s_per_step_runs"]).size() == 1);
    CHECK(uint64_t(row["peak_rss_bytes"]) > 0);
  }
  // --trace-dir: each child's Chrome trace, whose compute spans carry the rows of the step (B).
  for (int64_t B : {1, 2}) {
    const std::string text = k3::test::slurp(fmt::format("{}/batch-b{}-r1.json", traces, B));
    simdjson::dom::element trace;
    REQUIRE_MESSAGE(parser.parse(text).get(trace) == simdjson::SUCCESS, text.substr(0, 200));
    size_t attention = 0, wrong_rows = 0;
    for (simdjson::dom::element e : simdjson::dom::array(trace["traceEvents"])) {
      std::string_view name;
      if (e["name"].get(name) != simdjson::SUCCESS || name != "attention") continue;
      ++attention;
      int64_t fed = 0, token = -1;
      CHECK(e["args"]["token"].get(token) == simdjson::SUCCESS);
      // the prefill step (call 0) feeds the B prompts' 3 ids each, a decode step one id a sequence
      if (e["args"]["rows"].get(fed) != simdjson::SUCCESS || fed != (token == 0 ? 3 * B : B)) ++wrong_rows;
    }
    CHECK(attention > 0);
    CHECK(wrong_rows == 0);
  }
  CHECK(r.err.find("traces: " + traces) != std::string::npos);
  CHECK(k3flow(fmt::format("bench {} --mem-gb 0.09 --batch 1 --trace-dir {}", s.model, out)).code == 2);
  CHECK(
      k3flow(fmt::format("bench {} --mem-gb 0.09 --batch 2 --join 8 --trace-dir {}", s.model, traces)).code ==
      2);
  CHECK(k3flow(fmt::format("bench {} --mem-gb 0.09 --batch 1 --out {}", s.model, d / "none/x.json")).code ==
        2);
  CHECK(k3flow(fmt::format("bench {} --mem-gb 0.09 --batch 2,1", s.model)).code == 2);
  CHECK(k3flow(fmt::format("bench {} --mem-gb 0.09 --batch 0", s.model)).code == 2);
  CHECK(k3flow(fmt::format("bench {} --batch 1,2", s.model)).code == 2);
}

TEST_CASE(
    "bench --batch 3 --join N: a prompt joining two decoding sequences, inline and separate, same ids") {
  Small& s = small();
  const Run r =
      k3flow(fmt::format("bench {} --mem-gb 0.09 --gen 3 --ids 7,8,9 --repeat 1 --batch 3 --join 12 --json",
                         s.model),
             "", 300);
  REQUIRE_MESSAGE(r.code == 0, r.err);
  CHECK(r.err.find("TTFT med") != std::string::npos);
  CHECK(r.err.find("\ninline ") != std::string::npos);
  CHECK(r.err.find("\nseparate ") != std::string::npos);
  CHECK(r.err.find("every sequence emitted the same ids in every mode") != std::string::npos);
  simdjson::dom::parser parser;
  const simdjson::dom::element doc = results(parser, r.out, "join");
  CHECK(int64_t(doc["join_prompt_ids"]) == 12);
  simdjson::dom::array modes = doc["prefill"];
  REQUIRE(modes.size() == 2);
  CHECK(std::string_view(modes.at(0)["prefill"]) == "inline");
  CHECK(std::string_view(modes.at(1)["prefill"]) == "separate");
  for (simdjson::dom::element m : modes) CHECK(double(m["ttft_s"]) > 0);
  // The child: in a separate prefill the joiner's prompt has a step of its own (12 ids fed alone),
  // inline it rides with the two decoding ids (14).
  const std::string child = fmt::format(
      "bench {} --mem-gb 0.09 --gen 3 --ids 7,8,9 --batch-child 3 --join 12 --prefill-chunk 0", s.model);
  const Run sep = k3flow(child + " --prefill separate", "", 180),
            inl = k3flow(child + " --prefill inline", "", 180);
  REQUIRE_MESSAGE(sep.code == 0, sep.err);
  REQUIRE_MESSAGE(inl.code == 0, inl.err);
  const std::string tsep = batch_field(sep.out, "timeline", "JOIN"),
                    tinl = batch_field(inl.out, "timeline", "JOIN");
  CHECK(tsep.find(":12,") != std::string::npos);
  CHECK(tinl.find(":14,") != std::string::npos);
  // The same ids: the joiner's all of them; a running sequence skipped a step in the separate run,
  // so its ids there are the inline run's but the last.
  const std::string isep = batch_field(sep.out, "ids", "JOIN"), iinl = batch_field(inl.out, "ids", "JOIN");
  CHECK(isep.substr(isep.rfind('/')) == iinl.substr(iinl.rfind('/')));
  const std::string run_sep = isep.substr(0, isep.find('/')), run_inl = iinl.substr(0, iinl.find('/'));
  CHECK(run_inl.rfind(run_sep + ",", 0) == 0);
  CHECK(k3flow(fmt::format("bench {} --mem-gb 0.09 --batch 1,2 --join 8", s.model)).code == 2);
  CHECK(k3flow(fmt::format("bench {} --mem-gb 0.09 --batch 1 --join 8", s.model)).code == 2);
  CHECK(k3flow(fmt::format("bench {} --mem-gb 0.09 --batch 2 --join 8 --prefill both", s.model)).code == 2);
}
