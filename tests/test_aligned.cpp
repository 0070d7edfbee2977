// AlignedBuffer: alignment, rounding, zero fill, huge-page alignment of big buffers, move-only.
#include <doctest/doctest.h>

#include <cstdint>
#include <type_traits>
#include <utility>

#include "io/aligned.hpp"
#include "io/error.hpp"

using k3::io::AlignedBuffer;

#ifdef __SANITIZE_ADDRESS__
// The impossible-size case below must see posix_memalign fail, not ASan abort.
extern "C" const char* __asan_default_options() {
  return "allocator_may_return_null=1";
}
#endif

namespace {
bool all_zero(const AlignedBuffer& b) {
  for (std::byte x : b.bytes())
    if (x != std::byte{0}) return false;
  return true;
}
uintptr_t addr(const AlignedBuffer& b) {
  return reinterpret_cast<uintptr_t>(b.data());
}
}  // namespace

static_assert(!std::is_copy_constructible_v<AlignedBuffer>);
static_assert(!std::is_copy_assignable_v<AlignedBuffer>);
static_assert(std::is_nothrow_move_constructible_v<AlignedBuffer>);

TEST_CASE("size is rounded up to the alignment; memory is aligned and zero-filled") {
  AlignedBuffer a(1);
  CHECK(a.size() == 4096);
  CHECK(addr(a) % 4096 == 0);
  CHECK(all_zero(a));
  AlignedBuffer b(100, 64);
  CHECK(b.size() == 128);
  CHECK(addr(b) % 64 == 0);
  CHECK(all_zero(b));
  AlignedBuffer c(8192);
  CHECK(c.size() == 8192);
  CHECK(c.bytes().size() == 8192);
}

TEST_CASE("big buffers are 2 MiB aligned (so transparent huge pages can back them)") {
  AlignedBuffer big((size_t{5} << 20) + 1);
  CHECK(big.size() == (size_t{5} << 20) + 4096);
  CHECK(addr(big) % (size_t{2} << 20) == 0);
  CHECK(all_zero(big));
}

TEST_CASE("empty buffers hold nothing") {
  AlignedBuffer e;
  CHECK(e.data() == nullptr);
  CHECK(e.size() == 0);
  AlignedBuffer z(0);
  CHECK(z.data() == nullptr);
  CHECK(z.bytes().empty());
}

TEST_CASE("move transfers ownership and leaves the source empty") {
  AlignedBuffer a(4096);
  a.data()[7] = std::byte{42};
  std::byte* p = a.data();
  AlignedBuffer b(std::move(a));
  CHECK(b.data() == p);
  CHECK(b.data()[7] == std::byte{42});
  CHECK(a.data() == nullptr);
  CHECK(a.size() == 0);
  AlignedBuffer c(64, 64);
  c = std::move(b);
  CHECK(c.data() == p);
  CHECK(c.size() == 4096);
  CHECK(b.data() == nullptr);
}

TEST_CASE("bad alignments and impossible sizes are refused with an Error") {
  CHECK_THROWS_AS(AlignedBuffer(16, 3), k3::io::Error);
  CHECK_THROWS_AS(AlignedBuffer(16, 0), k3::io::Error);
  CHECK_THROWS_AS(AlignedBuffer(SIZE_MAX - 10), k3::io::Error);
  CHECK_THROWS_AS(AlignedBuffer(SIZE_MAX / 2), k3::io::Error);
}
