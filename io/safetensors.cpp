#include "io/safetensors.hpp"

namespace k3::io {

const char* dtype_name(DType d) {
  switch (d) {
    case DType::U8: return "U8";
    case DType::BF16: return "BF16";
    case DType::F16: return "F16";
    case DType::F32: return "F32";
  }
  return "?";
}

size_t dtype_size(DType d) {
  switch (d) {
    case DType::U8: return 1;
    case DType::BF16: return 2;
    case DType::F16: return 2;
    case DType::F32: return 4;
  }
  return 0;
}

uint64_t TensorInfo::numel() const {
  uint64_t n = 1;
  for (unsigned i = 0; i < rank; ++i) n *= shape[i];
  return n;
}

}  // namespace k3::io
