// Progress bars on stderr for generate's long silent phases (pipeline/support/progress.*, decoder.cpp,
// streaming_run.cpp): loading a resident model (bytes), the first decode step (layers, and the
// pinned trunk bytes of a streamed run). Driven through the binary on a synthetic checkpoint with
// stderr a file, not a terminal:
//   - --progress forces the bars: each phase's bar appears on stderr and its last redraw shows the
//     total (100%, done == total);
//   - without it (not a terminal) nothing is drawn; --no-progress never draws;
//   - stdout is the same bytes either way (the text continuation).
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <string>

#include "tests/run_helpers.hpp"

using k3::test::Run;
using k3::test::TempDir;

namespace {

Run k3flow(const std::string& args) {
  return k3::test::k3flow_sh(args);
}

struct Model {
  TempDir dir;
  std::string path;
  Model() {
    path = dir / "m";
    const Run s = k3flow(fmt::format("synth {} --size tiny --layers 8 --seed 3", path));
    REQUIRE_MESSAGE(s.code == 0, s.err);
  }
};

Model& model() {
  static Model m;
  return m;
}

// The last redraw of the bar labelled `label` on stderr (bars redraw with '\r'), "" if none.
std::string last_draw(const std::string& err, const std::string& label) {
  const std::string key = "\r" + label + " [";
  const size_t at = err.rfind(key);
  if (at == std::string::npos) return "";
  const size_t end = err.find_first_of("\r\n", at + 1);
  return err.substr(at + 1, end == std::string::npos ? std::string::npos : end - at - 1);
}

}  // namespace

TEST_CASE("--progress draws load and first-step bars that end at their totals; stdout is unchanged") {
  const std::string base = fmt::format("generate {} --prompt hello --gen 4 --ignore-eos", model().path);
  for (const char* budget : {"", "--mem-gb 1", "--preset ultra"}) {
    CAPTURE(budget);
    const Run plain = k3flow(base + " " + budget);
    const Run forced = k3flow(base + " " + budget + " --progress");
    const Run off = k3flow(base + " " + budget + " --no-progress");
    REQUIRE_MESSAGE(plain.code == 0, plain.err);
    REQUIRE_MESSAGE(forced.code == 0, forced.err);
    REQUIRE_MESSAGE(off.code == 0, off.err);
    INFO(forced.err);
    CHECK(!plain.out.empty());
    CHECK(forced.out == plain.out);
    CHECK(off.out == plain.out);
    for (const Run* r : {&plain, &off}) {
      CHECK(r->err.find("load [") == std::string::npos);
      CHECK(r->err.find("first step [") == std::string::npos);
      CHECK(r->err.find('\r') == std::string::npos);
    }

    const std::string step = last_draw(forced.err, "first step");
    CHECK(step.find("100%") != std::string::npos);
    CHECK(step.find("8 / 8 layers") != std::string::npos);
    if (*budget == 0) {
      const std::string load = last_draw(forced.err, "load");
      REQUIRE(!load.empty());
      CHECK(load.find("100%") != std::string::npos);
      // "X / X": done equals the total.
      const size_t slash = load.find(" / ");
      REQUIRE(slash != std::string::npos);
      const size_t open = load.find("% ") + 2;
      const std::string done = load.substr(open, slash - open);
      CHECK(load.substr(slash + 3, done.size()) == done);
    } else {
      CHECK(last_draw(forced.err, "load").empty());  // a streamed run loads nothing up front
    }
    if (std::string(budget) == "--mem-gb 1") CHECK(step.find("pinned") != std::string::npos);  // all pinned
  }
}

TEST_CASE("--progress and --no-progress exclude each other") {
  const Run r = k3flow(fmt::format("generate {} --prompt hi --gen 1 --progress --no-progress", model().path));
  CHECK(r.code == 2);
}
