#include "io/aligned.hpp"

#include <fmt/format.h>
#include <sys/mman.h>

#include <cstdlib>
#include <cstring>
#include <utility>

#include "io/env.hpp"
#include "io/error.hpp"

namespace k3::io {

namespace {
// Buffers this large get 2 MiB alignment and transparent-huge-page advice: weight slots and
// expert blobs are read once per use and scanned linearly, so fewer TLB misses pay (docs/engine.md §3.4).
constexpr size_t kHugePage = size_t{2} << 20;
}  // namespace

AlignedBuffer::AlignedBuffer(size_t bytes, size_t align) {
  if (align < sizeof(void*) || (align & (align - 1)) != 0) {
    throw usage_error(
        fmt::format("AlignedBuffer: alignment {} is not a power of two >= {}", align, sizeof(void*)));
  }
  if (bytes == 0) return;
  if (bytes > SIZE_MAX - align)
    throw runtime_error(fmt::format("AlignedBuffer: {} bytes is too large", bytes));
  const size_t size = align_up(bytes, align);
  // K3_NOHUGE=1 keeps 4 KiB pages (docs/engine.md §5.3), for A/B runs and hosts without THP.
  static const bool no_huge = env::flag(env::kNoHuge);
  const bool huge = size >= kHugePage && !no_huge;
  const size_t alignment = huge && align < kHugePage ? kHugePage : align;
  void* p = nullptr;
  if (const int err = ::posix_memalign(&p, alignment, size); err != 0) {
    throw runtime_error(
        fmt::format("cannot allocate {} bytes aligned to {}: {}", size, alignment, std::strerror(err)));
  }
  if (huge) ::madvise(p, size, MADV_HUGEPAGE);  // advice only; no THP support is fine
  std::memset(p, 0, size);
  data_ = static_cast<std::byte*>(p);
  size_ = size;
}

AlignedBuffer::AlignedBuffer(AlignedBuffer&& o) noexcept
    : data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)) {}

AlignedBuffer& AlignedBuffer::operator=(AlignedBuffer&& o) noexcept {
  if (this != &o) {
    std::free(data_);
    data_ = std::exchange(o.data_, nullptr);
    size_ = std::exchange(o.size_, 0);
  }
  return *this;
}

AlignedBuffer::~AlignedBuffer() {
  std::free(data_);
}

}  // namespace k3::io
