// A run whose hidden state goes non-finite names the first layer whose output did (index and kind),
// in the resident forward (stages/forward.cpp) and in the streamed graph (pipeline/graph/graph.cpp):
// a NaN written into one layer's input_layernorm gain of a synthetic checkpoint (`k3flow synth
// --size tiny --layers 8`: dense layer 0, MLA layers 3 and 7, KDA the rest) makes `k3flow generate`
// exit 4 with one line naming that layer; a NaN in the final norm names the head, every layer being
// finite. The scan reads the hidden state and changes no bit: the clean model's logits are the same
// resident and streamed (test_streaming_run.cpp holds every strategy to that).
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>

#include "io/safetensors.hpp"
#include "tests/nan_weight.hpp"
#include "tests/run_helpers.hpp"

namespace fs = std::filesystem;
using k3::test::k3flow;
using k3::test::Run;
using k3::test::slurp;
using k3::test::TempDir;

namespace {

struct Model {
  TempDir dir;
  std::string clean;
  Model() {
    clean = dir / "clean";
    const Run s = k3flow(fmt::format("synth {} --size tiny --layers 8 --shards 2 --seed 5", clean));
    REQUIRE_MESSAGE(s.code == 0, s.err);
  }
};

Model& model() {
  static Model m;
  return m;
}

// A copy of the clean model with `tensor`'s first 16 bytes set to NaN (tests/nan_weight.hpp).
std::string poisoned(const TempDir& d, const std::string& tensor) {
  const fs::path m = d.path / "nan";
  k3::test::copy_with_nan(model().clean, m, tensor);
  return m.string();
}

const char* const kRuns[] = {"", "--preset ultra", "--preset ultra --strategy serial", "--mem-gb 1"};

}  // namespace

TEST_CASE("a NaN weight in one layer: exit 4 naming that layer and its kind, resident and streamed") {
  TempDir d;
  struct Case {
    int layer;
    const char* kind;
  };
  for (const Case& c : {Case{2, "KDA"}, Case{3, "MLA"}, Case{6, "KDA"}}) {
    const std::string m =
        poisoned(d, fmt::format("language_model.model.layers.{}.input_layernorm.weight", c.layer));
    for (const char* flags : kRuns) {
      CAPTURE(c.layer);
      CAPTURE(flags);
      const Run r =
          k3flow(fmt::format("generate {} --ids 5,900,17 --gen 3 --out {} {}", m, d / "r.json", flags));
      INFO(r.out);
      INFO(r.err);
      CHECK(r.code == 4);
      CHECK(r.err.find("not finite") != std::string::npos);
      CHECK(r.err.find(fmt::format("layer {} ({}", c.layer, c.kind)) != std::string::npos);
      CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);  // one line
      CHECK(!fs::exists(d / "r.json"));
    }
  }
}

TEST_CASE("a NaN in the final norm: every layer finite, the head is named") {
  TempDir d;
  const std::string m = poisoned(d, "language_model.model.norm.weight");
  for (const char* flags : kRuns) {
    CAPTURE(flags);
    const Run r = k3flow(fmt::format("generate {} --ids 5,900,17 --gen 2 {}", m, flags));
    INFO(r.err);
    CHECK(r.code == 4);
    CHECK(r.err.find("every layer's output was finite") != std::string::npos);
    CHECK(r.err.find("layer 0 (") == std::string::npos);
  }
}

TEST_CASE("a NaN in the embedding row of the prompt's first id: the embedding is named") {
  TempDir d;
  // Row 0 of embed_tokens: the prompt starts with id 0.
  const std::string m = poisoned(d, "language_model.model.embed_tokens.weight");
  for (const char* flags : kRuns) {
    CAPTURE(flags);
    const Run r = k3flow(fmt::format("generate {} --ids 0,900,17 --gen 2 {}", m, flags));
    INFO(r.err);
    CHECK(r.code == 4);
    CHECK(r.err.find("the embedding") != std::string::npos);
  }
}

TEST_CASE("the clean model decodes with the scan in place, resident and streamed to the same bits") {
  TempDir d;
  std::string ref;
  for (const char* flags : kRuns) {
    CAPTURE(flags);
    const Run r = k3flow(fmt::format("generate {} --ids 5,900,17 --gen 4 --dump-logits {} {}", model().clean,
                                     d / "l.bin", flags));
    REQUIRE_MESSAGE(r.code == 0, r.err);
    const std::string logits = slurp(d / "l.bin");
    if (ref.empty()) ref = logits;
    CHECK(logits == ref);
  }
}
