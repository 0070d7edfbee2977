#include "kernels/dispatch.hpp"

#include <atomic>
#include <cstdlib>
#include <cstring>

namespace k3::kernels {

namespace {

bool cpu_has_avx2() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}

// libgcc's probe also checks XCR0, so a kernel that does not save zmm state reports no AVX-512.
bool cpu_has_avx512() {
  __builtin_cpu_init();
  return cpu_has_avx2() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
}

Isa best_supported() {
  if (isa_supported(Isa::avx512)) return Isa::avx512;
  if (isa_supported(Isa::avx2)) return Isa::avx2;
  return Isa::scalar;
}

Isa initial_isa() {
  const char* env = std::getenv("K3FLOW_ISA");
  if (env != nullptr) {
    for (Isa isa : {Isa::scalar, Isa::avx2, Isa::avx512}) {
      if (std::strcmp(env, isa_name(isa)) == 0) return isa_supported(isa) ? isa : best_supported();
    }
  }
  return best_supported();
}

// [kernel][body] call counts; relaxed increments, read only by tests between kernel calls.
std::atomic<uint64_t> g_body_runs[3][3];

std::atomic<int>& active_slot() {
  static std::atomic<int> slot{static_cast<int>(initial_isa())};
  return slot;
}

}  // namespace

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::scalar:
      return "scalar";
    case Isa::avx2:
      return "avx2";
    case Isa::avx512:
      return "avx512";
  }
  return "unknown";
}

bool isa_supported(Isa isa) {
  static const bool avx2 = cpu_has_avx2();
  static const bool avx512 = cpu_has_avx512();
  switch (isa) {
    case Isa::scalar:
      return true;
    case Isa::avx2:
      return avx2;
    case Isa::avx512:
      return avx512;
  }
  return false;
}

std::vector<Isa> supported_isas() {
  std::vector<Isa> out;
  for (Isa isa : {Isa::scalar, Isa::avx2, Isa::avx512}) {
    if (isa_supported(isa)) out.push_back(isa);
  }
  return out;
}

Isa active_isa() {
  return static_cast<Isa>(active_slot().load(std::memory_order_relaxed));
}

void set_active_isa(Isa isa) {
  if (isa_supported(isa)) active_slot().store(static_cast<int>(isa), std::memory_order_relaxed);
}

const char* kernel_name(Kernel kernel) {
  switch (kernel) {
    case Kernel::matmul:
      return "matmul";
    case Kernel::kda_step:
      return "kda_step";
    case Kernel::router:
      return "router";
  }
  return "unknown";
}

// Kept with kernels/CMakeLists.txt's K3_KERNEL_AVX2 / K3_KERNEL_AVX512 lists.
std::vector<Isa> built_isas(Kernel kernel) {
  switch (kernel) {
    case Kernel::matmul:
    case Kernel::kda_step:
    case Kernel::router:
      return {Isa::scalar, Isa::avx2, Isa::avx512};
  }
  return {Isa::scalar};
}

void count_body_run(Kernel kernel, Isa body) {
  g_body_runs[static_cast<int>(kernel)][static_cast<int>(body)].fetch_add(1, std::memory_order_relaxed);
}

uint64_t body_runs(Kernel kernel, Isa body) {
  return g_body_runs[static_cast<int>(kernel)][static_cast<int>(body)].load(std::memory_order_relaxed);
}

}  // namespace k3::kernels
