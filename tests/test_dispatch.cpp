#include <doctest/doctest.h>

#include <cstdlib>
#include <cstring>

#include "kernels/dispatch.hpp"

using namespace k3::kernels;

// Must stay the first test in this file: the choice is made once, at the first call.
TEST_CASE("K3FLOW_ISA picks the body at the first call") {
  const char* before = std::getenv("K3FLOW_ISA");
  const bool had = before != nullptr;
  setenv("K3FLOW_ISA", "scalar", 1);
  CHECK(active_isa() == Isa::scalar);
  if (had)
    setenv("K3FLOW_ISA", before, 1);
  else
    unsetenv("K3FLOW_ISA");
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
