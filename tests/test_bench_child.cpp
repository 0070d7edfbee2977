// pipeline/bench/bench_child and support/process_memory: a spawned process's peak RSS is its own,
// however much the process that spawned it holds or once held.
//
// The kernel folds the spawning address space's peak into the child's ru_maxrss at exec, so without
// care the bench reported its own probe buffers as every child's peak, and `k3flow generate` started
// from a large parent printed the parent's size as its "PEAK RSS".
#include <doctest/doctest.h>
#include <simdjson.h>
#include <sys/mman.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <string>

#include "pipeline/bench/bench_child.hpp"
#include "pipeline/support/process_memory.hpp"
#include "tests/run_helpers.hpp"

using k3::pipeline::run_child;

namespace {

constexpr uint64_t kMiB = uint64_t{1} << 20;
constexpr size_t kBig = size_t{768} << 20;

// kBig bytes of this process made resident (every page written), unmapped on destruction.
struct Resident {
  void* p = ::mmap(nullptr, kBig, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  Resident() {
    REQUIRE(p != MAP_FAILED);
    std::memset(p, 1, kBig);
  }
  ~Resident() { ::munmap(p, kBig); }
  Resident(const Resident&) = delete;
  Resident& operator=(const Resident&) = delete;
};

}  // namespace

TEST_CASE("this process's peak and current RSS come from /proc/self/status and see a 768 MiB touch") {
  const uint64_t before = k3::pipeline::current_rss_bytes();
  REQUIRE(before > 0);
  {
    const Resident big;
    CHECK(k3::pipeline::current_rss_bytes() >= before + kBig / 2);
    CHECK(k3::pipeline::peak_rss_bytes() >= kBig);
  }
  CHECK(k3::pipeline::current_rss_bytes() < before + kBig / 2);  // unmapped: gone from VmRSS
  CHECK(k3::pipeline::peak_rss_bytes() >= kBig);                 // but still this process's peak
  CHECK(k3::pipeline::proc_field_kb("/proc/self/status", "NoSuchField") == 0);
  CHECK(k3::pipeline::proc_field_kb("/no/such/file", "VmRSS") == 0);
}

TEST_CASE("a child's wait4 peak does not carry what the spawning process held before") {
  k3::test::TempDir d;
  { const Resident big; }
  std::ofstream("/proc/self/clear_refs") << "5";
  if (k3::pipeline::peak_rss_bytes() >= kBig) {
    MESSAGE("SKIPPED: /proc/self/clear_refs did not reset the peak here (Linux < 4.0 or /proc read-only)");
    return;
  }
  { const Resident big; }  // this process peaked above 768 MiB again, and let it go
  REQUIRE(k3::pipeline::peak_rss_bytes() >= kBig);
  const uint64_t now = k3::pipeline::current_rss_bytes();
  const k3::pipeline::ChildRun r = run_child({"/bin/sh", "-c", "exit 0"}, d.path);
  REQUIRE(r.ok());
  MESSAGE("a shell's peak from wait4: " << r.peak_rss_bytes / kMiB << " MiB; this process now " << now / kMiB
                                        << " MiB");
  // What the spawner holds now may be folded in, what it once held may not.
  CHECK(r.peak_rss_bytes < now + 64 * kMiB);
  CHECK(r.peak_rss_bytes < kBig / 2);
}

TEST_CASE("k3flow generate spawned beside 768 MiB held by its parent reports its own peak") {
  k3::test::TempDir d;
  const Resident big;  // held while the child runs: the kernel counts it in the child's ru_maxrss
  const std::string report = d / "run.json";
  const k3::pipeline::ChildRun r = run_child({K3FLOW_BIN, "generate", std::string(K3_FIXTURES) + "/tiny-k3",
                                              "--ids", "1,2", "--gen", "2", "--out", report},
                                             d.path);
  INFO(r.out, r.err);
  REQUIRE(r.ok());
  simdjson::dom::parser parser;
  simdjson::dom::element doc;
  REQUIRE(parser.load(report).get(doc) == simdjson::SUCCESS);
  uint64_t own = 0;
  REQUIRE(doc["peak_rss_bytes"].get(own) == simdjson::SUCCESS);
  MESSAGE("generate's own peak " << own / kMiB << " MiB; wait4 " << r.peak_rss_bytes / kMiB << " MiB");
  CHECK(own > 0);
  CHECK(own < kBig / 2);  // the tiny model's run, not its parent's 768 MiB
  const size_t at = r.out.find("PEAK RSS ");
  REQUIRE(at != std::string::npos);
  const std::string line = r.out.substr(at, r.out.find('\n', at) - at);
  CHECK_MESSAGE(line.find("GiB") == std::string::npos, line);  // MiB, not its parent's "1.0x GiB"
}
