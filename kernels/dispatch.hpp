// Run-time choice of the instruction set for the hot kernels. Every body produces identical bits;
// the choice only changes speed. K3FLOW_ISA=scalar|avx2|avx512 overrides (tests, benchmarks); asking
// for a set the CPU lacks falls back to the best available one.
#pragma once
#include <vector>

namespace k3::kernels {

enum class Isa { scalar, avx2, avx512 };

const char* isa_name(Isa);
bool isa_supported(Isa);             // by this CPU (and OS state saving)
std::vector<Isa> supported_isas();   // scalar first
Isa active_isa();                    // chosen once (env or best), cached
void set_active_isa(Isa);            // for tests and benchmarks; must be supported

}  // namespace k3::kernels
