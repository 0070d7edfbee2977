// Run-time choice of the instruction set for the hot kernels. Every body produces identical bits;
// the choice only changes speed. K3FLOW_ISA=scalar|avx2|avx512 overrides (tests, benchmarks); asking
// for a set the CPU lacks falls back to the best available one.
#pragma once
#include <cstdint>
#include <vector>

namespace k3::kernels {

enum class Isa { scalar, avx2, avx512 };

const char* isa_name(Isa);
bool isa_supported(Isa);            // by this CPU (and OS state saving)
std::vector<Isa> supported_isas();  // scalar first
Isa active_isa();                   // chosen once (env or best), cached
void set_active_isa(Isa);           // for tests and benchmarks; must be supported

// The kernels with more than one body. Tests that run "every body" check with these that each body
// this build contains really ran on a CPU that has it (a kernel may serve one set with another's
// body), instead of trusting the loop over supported_isas().
enum class Kernel { matmul, kda_step, router };
const char* kernel_name(Kernel);
std::vector<Isa> built_isas(Kernel);    // the bodies compiled into this build, scalar first
void count_body_run(Kernel, Isa body);  // each kernel's dispatch: one call of `body`
uint64_t body_runs(Kernel, Isa body);   // calls counted since the process started

}  // namespace k3::kernels
