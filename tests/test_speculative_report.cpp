// What a `--spec N` run tells and plans (docs/speculative.md), through the k3flow binary:
//   - the --out report's "speculative" object: the totals and one row per forward pass;
//   - the Chrome trace (--trace): every pass an event on the "decode: passes" row, "verify pass"
//     with its rows, drafted, accepted and emitted;
//   - the plan (`plan --spec N`, generate's own): the KDA rollback journal and the verify logits are
//     resident terms, the very bytes DecodeState allocates, and at the floor the child's peak RSS
//     stays under the budget.
// The drafts come from --spec-oracle (the plain run's answer) where the counts must be exact: the
// fixture models have random weights and rarely repeat themselves.
#include <doctest/doctest.h>
#include <fmt/format.h>
#include <simdjson.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "io/config.hpp"
#include "stages/forward.hpp"
#include "tests/run_helpers.hpp"
#include "tests/spec_totals.hpp"
#include "tests/trace_json.hpp"

namespace {

using k3::test::k3flow;
using k3::test::Run;
using k3::test::TempDir;

const std::string kModel = std::string(K3_FIXTURES) + "/tiny-k3";
// A passage said twice (18 ids): lookup drafts from the first decode step on at a minimum match of
// one id (the passage's repeat ends with the prompt: the first generated id breaks every longer one).
const std::string kPrompt = "17,203,34,2,239,195,88,61,17,203,34,2,239,195,88,61,17,203";

using k3::test::line_with;

// "generated ids: 1 2 3" -> "1,2,3"
std::string answer_of(const std::string& out) {
  std::string a = line_with(out, "generated ids: ").substr(15);
  std::replace(a.begin(), a.end(), ' ', ',');
  return a;
}

Run generate(const std::string& args) {
  const Run r = k3flow("generate " + kModel + " --ids " + kPrompt + " " + args);
  INFO(args);
  INFO(r.out);
  INFO(r.err);
  REQUIRE(!r.timed_out);
  REQUIRE(r.code == 0);
  return r;
}

struct PassRow {
  int64_t rows, drafted, accepted, emitted;
  bool operator==(const PassRow&) const = default;
};

// The drafter that verifies drafts at every 1-id match (rejected ones here: rollbacks exercised).
const std::string kEager = " --spec-policy fixed --spec-min-match 1";

// The oracle run of 30 tokens with --spec 4 after the 18-id prompt: the prefill emits one token,
// five passes of 4 drafts emit 5 each, and the last may draft only 3 (4 tokens are left).
const std::vector<PassRow> kOraclePasses = {{18, 0, 0, 1}, {5, 4, 4, 5}, {5, 4, 4, 5}, {5, 4, 4, 5},
                                            {5, 4, 4, 5},  {5, 4, 4, 5}, {4, 3, 3, 4}};

using Totals = k3::test::SpecTotals;
constexpr auto totals_of = k3::test::spec_totals;

}  // namespace

TEST_CASE("generate --spec --out: the report carries the totals and one row per pass") {
  for (const std::string budget : {"", " --preset ultra"}) {
    CAPTURE(budget);
    TempDir d;
    const Run plain = generate("--gen 30 --out " + (d / "plain.json") + budget);
    simdjson::dom::parser parser;
    simdjson::dom::element doc;
    REQUIRE(parser.load(d / "plain.json").get(doc) == simdjson::SUCCESS);
    CHECK(doc["speculative"].error() == simdjson::NO_SUCH_FIELD);  // no --spec: no object

    // Every draft right: the exact passes.
    generate("--gen 30 --spec 4 --spec-oracle " + answer_of(plain.out) + " --out " + (d / "oracle.json") +
             budget);
    REQUIRE(parser.load(d / "oracle.json").get(doc) == simdjson::SUCCESS);
    simdjson::dom::element s;
    REQUIRE(doc["speculative"].get(s) == simdjson::SUCCESS);
    CHECK(json_int(s, "drafts_per_pass") == 4);
    CHECK(json_string(s, "policy") == "oracle");
    CHECK(json_int(s, "drafted") == 23);
    CHECK(json_int(s, "accepted") == 23);
    CHECK(json_int(s, "passes") == 7);
    CHECK(json_int(s, "verify_passes") == 6);
    CHECK(json_int(s, "emitted") == 30);
    std::vector<PassRow> rows;
    simdjson::dom::array log;
    REQUIRE(s["pass_log"].get_array().get(log) == simdjson::SUCCESS);
    for (simdjson::dom::element p : log) {
      rows.push_back(
          {json_int(p, "rows"), json_int(p, "drafted"), json_int(p, "accepted"), json_int(p, "emitted")});
      double sec = -1;
      CHECK(p["seconds"].get_double().get(sec) == simdjson::SUCCESS);
      CHECK(sec >= 0);
    }
    CHECK(rows == kOraclePasses);
    // A streamed run's per-token rows are per pass, in the same order.
    simdjson::dom::array toks;
    REQUIRE(doc["tokens"].get_array().get(toks) == simdjson::SUCCESS);
    CHECK(toks.size() == (budget.empty() ? 0 : kOraclePasses.size()));

    // Prompt lookup: drafts that the random model mostly rejects. The rows add up to the totals
    // the run printed.
    const Run lookup = generate("--gen 30 --spec 3 --out " + (d / "lookup.json") + budget + kEager);
    const Totals t = totals_of(lookup.out);
    REQUIRE(parser.load(d / "lookup.json").get(doc) == simdjson::SUCCESS);
    REQUIRE(doc["speculative"].get(s) == simdjson::SUCCESS);
    CHECK(json_string(s, "policy") == "fixed");
    CHECK(json_int(s, "min_match") == 1);
    CHECK(json_int(s, "pauses") == 0);
    CHECK(json_int(s, "paused_tokens") == 0);
    CHECK(json_int(s, "drafted") == t.drafted);
    CHECK(json_int(s, "accepted") == t.accepted);
    CHECK(json_int(s, "passes") == t.passes);
    CHECK(json_int(s, "verify_passes") == t.verify);
    CHECK(json_int(s, "emitted") == 30);
    CHECK(t.drafted > 0);
    REQUIRE(s["pass_log"].get_array().get(log) == simdjson::SUCCESS);
    int64_t drafted = 0, accepted = 0, emitted = 0, verify = 0, i = 0;
    for (simdjson::dom::element p : log) {
      const PassRow r{json_int(p, "rows"), json_int(p, "drafted"), json_int(p, "accepted"),
                      json_int(p, "emitted")};
      CHECK(r.drafted <= 3);
      CHECK(r.accepted <= r.drafted);
      CHECK(r.emitted == r.accepted + 1);  // nothing stops a --ids run mid-pass but --gen
      CHECK(r.rows == (i++ == 0 ? 18 : r.drafted + 1));
      drafted += r.drafted;
      accepted += r.accepted;
      emitted += r.emitted;
      verify += r.drafted > 0;
    }
    CHECK(int64_t(log.size()) == t.passes);
    CHECK(drafted == t.drafted);
    CHECK(accepted == t.accepted);
    CHECK(verify == t.verify);
    CHECK(emitted == 30);

    // The adaptive policy at a 1-id minimum match: the drafts rejected, it pauses; the report's
    // policy fields are what the run printed.
    const Run adaptive =
        generate("--gen 30 --spec 3 --spec-min-match 1 --out " + (d / "adaptive.json") + budget);
    const std::string pl = line_with(adaptive.out, "speculative policy: ");
    long pauses = -1, paused = -1;
    REQUIRE(pl.find("adaptive, matches of >= 1 ids; ") != std::string::npos);
    std::sscanf(pl.c_str() + pl.find("; "), "; %ld pauses, %ld tokens", &pauses, &paused);
    REQUIRE(parser.load(d / "adaptive.json").get(doc) == simdjson::SUCCESS);
    REQUIRE(doc["speculative"].get(s) == simdjson::SUCCESS);
    CHECK(json_string(s, "policy") == "adaptive");
    CHECK(json_int(s, "min_match") == 1);
    CHECK(json_int(s, "pauses") == pauses);
    CHECK(json_int(s, "paused_tokens") == paused);
    CHECK(pauses >= 1);
    CHECK(paused > 0);
    CHECK(json_int(s, "drafted") < t.drafted);
  }
}

TEST_CASE(
    "generate --spec --trace: each pass is an event on the passes row, verify passes with their counts") {
  TempDir d;
  const Run plain = generate("--gen 30 --preset ultra");
  for (const bool oracle : {true, false}) {
    CAPTURE(oracle);
    const Run r =
        generate(fmt::format("--gen 30 --preset ultra --spec {} --trace {}{}", oracle ? 4 : 3, d / "t.json",
                             oracle ? " --spec-oracle " + answer_of(plain.out) : kEager));
    simdjson::dom::parser parser;
    simdjson::dom::element doc;
    REQUIRE(parser.load(d / "t.json").get(doc) == simdjson::SUCCESS);
    simdjson::dom::array events;
    REQUIRE(doc["traceEvents"].get_array().get(events) == simdjson::SUCCESS);
    std::vector<PassRow> passes;
    std::vector<int64_t> tids, begins, ends;
    int64_t passes_row = -1, verify_events = 0;
    for (simdjson::dom::element e : events) {
      std::string_view cat, name, ph;
      REQUIRE(e["ph"].get_string().get(ph) == simdjson::SUCCESS);
      REQUIRE(e["name"].get_string().get(name) == simdjson::SUCCESS);
      if (ph == "M") {
        std::string_view label;
        if (name == "thread_name" && e["args"]["name"].get_string().get(label) == simdjson::SUCCESS &&
            label == "decode: passes")
          passes_row = json_int(e, "tid");
        continue;
      }
      if (e["cat"].get_string().get(cat) != simdjson::SUCCESS || cat != "spec") continue;
      CHECK(ph == "X");
      CHECK((name == "verify pass" || name == "plain pass"));
      const PassRow p{json_arg(e, "rows"), json_arg(e, "drafted"), json_arg(e, "accepted"),
                      json_arg(e, "emitted")};
      CHECK((name == "verify pass") == (p.drafted > 0));
      verify_events += name == "verify pass";
      passes.push_back(p);
      tids.push_back(json_int(e, "tid"));
      begins.push_back(json_int(e, "ts"));
      ends.push_back(json_int(e, "ts") + json_int(e, "dur"));
    }
    if (oracle) CHECK(passes == kOraclePasses);
    const Totals t = totals_of(r.out);
    CHECK(int64_t(passes.size()) == t.passes);
    CHECK(verify_events == t.verify);
    int64_t drafted = 0, accepted = 0, emitted = 0;
    for (const PassRow& p : passes) {
      drafted += p.drafted;
      accepted += p.accepted;
      emitted += p.emitted;
    }
    CHECK(drafted == t.drafted);
    CHECK(accepted == t.accepted);
    CHECK(emitted == 30);
    // One row, named, and the passes follow each other on it.
    REQUIRE(passes_row >= 0);
    for (size_t i = 0; i < tids.size(); ++i) {
      CHECK(tids[i] == passes_row);
      if (i > 0) CHECK(begins[i] >= ends[i - 1]);
    }
  }
}

TEST_CASE(
    "plan --spec N: the journal and the verify logits are resident terms, the bytes DecodeState allocates") {
  const k3::io::ModelConfig cfg = k3::io::load_config(kModel + "/config.json");
  for (const int n : {1, 8, 16}) {
    CAPTURE(n);
    const auto floor_of = [&](int spec, std::string* text = nullptr) {
      const Run r = k3flow(fmt::format("plan {} --preset ultra --context 64 --spec {} --json", kModel, spec));
      INFO(r.err);
      REQUIRE(r.code == 0);
      if (text) *text = r.out;
      simdjson::dom::parser parser;
      simdjson::dom::element doc;
      REQUIRE(parser.parse(r.out).get(doc) == simdjson::SUCCESS);
      return json_int(doc, "floor");
    };
    std::string with;
    const int64_t plain = floor_of(0), spec = floor_of(n, &with);
    k3::stages::DecodeState st(cfg, cfg.n_layers, 64);
    const uint64_t journal = st.journal_bytes(size_t(n) + 1);
    CHECK(journal > 0);
    CHECK(uint64_t(spec - plain) == journal + 4 * uint64_t(n) * uint64_t(cfg.vocab));
    CHECK(with.find(fmt::format("KDA rollback journal (--spec {}, {} rows)", n, n + 1)) != std::string::npos);
    // The journal DecodeState allocates for a pass is the planned one.
    st.begin_journal(size_t(n) + 1);
    CHECK(st.journal_bytes(size_t(n) + 1) == journal);
  }
  // generate's plan holds it too (prompt 18 + --gen 8 + 1 = 27 positions, as plan --context 27).
  const Run g = k3flow("generate " + kModel + " --ids " + kPrompt + " --gen 8 --preset ultra --spec 8");
  REQUIRE(g.code == 0);
  const Run p = k3flow(fmt::format("plan {} --preset ultra --context 27 --spec 8", kModel));
  REQUIRE(p.code == 0);
  CHECK(line_with(g.out, "KDA rollback journal (--spec 8") ==
        line_with(p.out, "KDA rollback journal (--spec 8"));
  CHECK(g.out.find("KDA rollback journal (--spec 8") != std::string::npos);
  CHECK(k3flow(fmt::format("plan {} --preset ultra --spec 17", kModel)).code == 2);
}

TEST_CASE("generate --spec 16 at the floor: the child's peak RSS stays under the budget") {
  // Wide KDA layers (32 heads x 128) make the journal large: 17 rows of recurrence inputs plus the
  // entry state, ~4 MiB a KDA layer, far more than the plan's slack were it not planned.
  TempDir d;
  const std::string model = d / "m";
  const Run s =
      k3flow(fmt::format("synth {} --size tiny --layers 8 --heads 32 --head-dim 128 --seed 3", model));
  REQUIRE_MESSAGE(s.code == 0, s.err);
  // The drafts are the plain run's answer (--spec-oracle): a random model gives lookup nothing to
  // find, and the journal is allocated by the first verify pass.
  const std::string ids = "5,900,17,3,640,201,88,12,5,900,17,3,640,201,88,12,5,900";
  const int gen = 24;
  const Run plain = k3flow(fmt::format("generate {} --ids {} --gen {}", model, ids, gen));
  REQUIRE(plain.code == 0);
  const Run p = k3flow(fmt::format("plan {} --mem-gb 64 --context {} --spec 16 --json", model, 18 + gen + 1));
  REQUIRE_MESSAGE(p.code == 0, p.err);
  simdjson::dom::parser parser;
  simdjson::dom::element doc;
  REQUIRE(parser.parse(p.out).get(doc) == simdjson::SUCCESS);
  const uint64_t floor = uint64_t(json_int(doc, "floor"));
  // --mem-gb in GiB, rounded up to the byte's precision.
  const double gb = std::ceil(double(floor) / double(1 << 30) * 1e9) / 1e9;
  const uint64_t budget = uint64_t(std::llround(gb * double(1 << 30)));
  const Run r = k3flow(fmt::format("generate {} --ids {} --gen {} --mem-gb {:.9f} --spec 16 --spec-oracle {}",
                                   model, ids, gen, gb, answer_of(plain.out)),
                       "", k3::test::kSanitized ? 240 : 60);
  INFO(r.out);
  INFO(r.err);
  REQUIRE(r.code == 0);
  // Planned with the process terms; under ASan the process itself (its shadow memory) is larger
  // than the floor's allowance and generate warns, rightly, that the budget cannot hold.
  K3_CHECK_UNLESS_SANITIZED(r.out.find("WARNING") == std::string::npos);
  const Totals t = totals_of(r.out);
  CHECK(t.verify == 2);  // 1 + 17 + 6 tokens
  CHECK(line_with(r.out, "generated ids:") == line_with(plain.out, "generated ids:"));
  MESSAGE(fmt::format("--spec 16 at the floor {} B: child peak RSS {} B, {} verify passes", budget,
                      r.peak_rss, t.verify));
  K3_CHECK_UNLESS_SANITIZED(r.peak_rss <= budget);
}
