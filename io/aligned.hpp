// Owned, aligned memory for O_DIRECT reads and weight slots (one owner per allocation).
#pragma once
#include <cstddef>
#include <span>

namespace k3::io {

class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  // Length rounded up to `align`; zero-filled. Huge-page advice when large (docs/engine.md §3.4).
  explicit AlignedBuffer(size_t bytes, size_t align = 4096);
  AlignedBuffer(AlignedBuffer&&) noexcept;
  AlignedBuffer& operator=(AlignedBuffer&&) noexcept;
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;
  ~AlignedBuffer();

  std::byte* data() const { return data_; }
  size_t size() const { return size_; }
  std::span<std::byte> bytes() const { return {data_, size_}; }

 private:
  std::byte* data_ = nullptr;
  size_t size_ = 0;
};

constexpr size_t kDirectAlign = 4096;
constexpr size_t align_up(size_t n, size_t a) {
  return (n + a - 1) / a * a;
}
constexpr size_t align_down(size_t n, size_t a) {
  return n / a * a;
}

}  // namespace k3::io
