// "Every body" loops that cannot pass vacuously. A BodyCheck snapshots the kernels' per-body call
// counts (kernels/dispatch.hpp); check(), at the end of the test, reports which bodies ran and
// fails when a body this build contains for the kernel did not run on a CPU that has it. Looping over
// supported_isas() alone proves nothing: a kernel may serve an ISA with another body, and a
// dispatch change could route every ISA to one body while the loop still "passes" for each.
#pragma once

#include <doctest/doctest.h>

#include <array>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "kernels/dispatch.hpp"

namespace k3::test {

class BodyCheck {
 public:
  BodyCheck(std::initializer_list<kernels::Kernel> kernels) : kernels_(kernels) {
    for (kernels::Kernel k : kernels_) before_.push_back(snapshot(k));
  }

  void check() const {
    for (size_t i = 0; i < kernels_.size(); ++i) {
      const kernels::Kernel k = kernels_[i];
      const std::string kernel = kernels::kernel_name(k);
      const auto now = snapshot(k);
      std::string ran, not_here;
      for (kernels::Isa isa : kernels::built_isas(k)) {
        const auto at = static_cast<size_t>(isa);
        const uint64_t calls = now[at] - before_[i][at];
        const std::string name = kernels::isa_name(isa);
        if (kernels::isa_supported(isa)) {
          const std::string missed =
              kernel + ": the " + name + " body is built and this CPU has it, but it never ran";
          CHECK_MESSAGE(calls > 0, missed);
          if (calls > 0) ran += " " + name + " (" + std::to_string(calls) + " calls)";
        } else {
          not_here += " " + name;
        }
      }
      const std::string report =
          kernel + " bodies run:" + ran +
          (not_here.empty() ? std::string() : "; built but not run, this CPU lacks:" + not_here);
      MESSAGE(report);
    }
  }

 private:
  static std::array<uint64_t, 3> snapshot(kernels::Kernel k) {
    std::array<uint64_t, 3> out{};
    for (kernels::Isa isa : {kernels::Isa::scalar, kernels::Isa::avx2, kernels::Isa::avx512}) {
      out[static_cast<size_t>(isa)] = kernels::body_runs(k, isa);
    }
    return out;
  }

  std::vector<kernels::Kernel> kernels_;
  std::vector<std::array<uint64_t, 3>> before_;
};

}  // namespace k3::test
