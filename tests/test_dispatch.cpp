#include <doctest/doctest.h>

#include <cstring>

#include "kernels/dispatch.hpp"

using namespace k3::kernels;

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
  set_active_isa(before);
}
