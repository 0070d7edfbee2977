#include <doctest/doctest.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string>

#include "kernels/dispatch.hpp"

using namespace k3::kernels;

namespace {

std::string self_exe() {
  char buf[4096];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  REQUIRE(n > 0);
  return std::string(buf, static_cast<size_t>(n));
}

}  // namespace

// The choice is made once, at a process's first active_isa(), so it is checked in a fresh process:
// the next case runs this binary again with only this case selected. Skipped in a normal run.
TEST_CASE("dispatch child: the first active_isa() follows K3FLOW_ISA" * doctest::skip()) {
  const char* want = std::getenv("K3_TEST_WANT_ISA");
  REQUIRE(want != nullptr);
  CHECK(std::string(isa_name(active_isa())) == want);
}

TEST_CASE("K3FLOW_ISA picks the body at a process's first call; an unsupported or unknown name, the best") {
  const std::string exe = self_exe();
  const Isa best = supported_isas().back();
  for (const char* name : {"scalar", "avx2", "avx512", "sse9"}) {
    CAPTURE(name);
    Isa want = best;
    for (Isa isa : {Isa::scalar, Isa::avx2, Isa::avx512}) {
      if (std::strcmp(name, isa_name(isa)) == 0 && isa_supported(isa)) want = isa;
    }
    const std::string cmd = std::string("K3FLOW_ISA=") + name + " K3_TEST_WANT_ISA=" + isa_name(want) + " '" +
                            exe + "' --no-skip --test-case='dispatch child*' --minimal >/dev/null 2>&1";
    CHECK(std::system(cmd.c_str()) == 0);
  }
}

TEST_CASE("dispatch: scalar always available, set/get round trip, names") {
  const auto isas = supported_isas();
  REQUIRE(!isas.empty());
  CHECK(isas.front() == Isa::scalar);
  CHECK(isa_supported(Isa::scalar));
  CHECK(std::strcmp(isa_name(Isa::avx2), "avx2") == 0);
  CHECK(std::strcmp(isa_name(Isa::avx512), "avx512") == 0);
  const Isa before = active_isa();
  CHECK(isa_supported(before));
  for (Isa isa : isas) {
    set_active_isa(isa);
    CHECK(active_isa() == isa);
  }
  if (isa_supported(Isa::avx512)) CHECK(isa_supported(Isa::avx2));
  set_active_isa(supported_isas().back());  // asking for an unsupported set keeps the current one
  if (!isa_supported(Isa::avx512)) {
    set_active_isa(Isa::avx512);
    CHECK(active_isa() == supported_isas().back());
  }
  set_active_isa(before);
}

TEST_CASE("every kernel's built bodies start with scalar; a body run is counted for that kernel only") {
  for (Kernel k : {Kernel::matmul, Kernel::kda_step, Kernel::router}) {
    CAPTURE(kernel_name(k));
    const auto built = built_isas(k);
    REQUIRE(!built.empty());
    CHECK(built.front() == Isa::scalar);
  }
  const uint64_t m = body_runs(Kernel::matmul, Isa::avx2), r = body_runs(Kernel::router, Isa::avx2);
  count_body_run(Kernel::matmul, Isa::avx2);
  CHECK(body_runs(Kernel::matmul, Isa::avx2) == m + 1);
  CHECK(body_runs(Kernel::router, Isa::avx2) == r);
}
