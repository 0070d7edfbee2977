#include "kernels/matmul_bodies.hpp"

namespace k3::kernels::detail {

MatmulBodies matmul_bodies_avx2() { return matmul_bodies_scalar(); }

}  // namespace k3::kernels::detail
