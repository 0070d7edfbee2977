// The full-scale replica of the released checkpoint. Its tensor list is io/k3_names (the single
// enumeration of the released tensors); until that lands, --sparse is refused.
#include "io/error.hpp"
#include "perf/synth.hpp"

namespace k3::perf {

CheckpointPlan plan_sparse() {
  throw io::runtime_error(
      "synth --sparse: the released tensor list (io/k3_names) is not available in this build");
}

}  // namespace k3::perf
