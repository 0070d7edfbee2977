// A read-only file for positioned reads. Holds a buffered descriptor always and an O_DIRECT one
// when asked for and the filesystem accepts it (tmpfs and some others refuse: buffered fallback).
// Every syscall is capped at 1 GiB; short reads and EINTR are resumed at the right offset.
#pragma once
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <span>

namespace k3::io {

// No read syscall asks for more than this (Linux stops at 0x7ffff000 anyway; macOS rejects >= 2^31).
constexpr size_t kMaxReadSyscall = size_t{1} << 30;

class File {
 public:
  enum class Mode { buffered, direct_preferred };

  // Throws Error (runtime) naming the path when it cannot be opened.
  static File open_read(const std::filesystem::path& path, Mode mode);
  File(File&&) noexcept;
  File& operator=(File&&) noexcept;
  File(const File&) = delete;
  File& operator=(const File&) = delete;
  ~File();

  const std::filesystem::path& path() const { return path_; }
  uint64_t size() const { return size_; }
  bool direct() const { return direct_fd_ >= 0; }
  int buffered_fd() const { return fd_; }
  int direct_fd() const { return direct_fd_; }  // -1 when O_DIRECT is not in effect

  // Reads exactly dst.size() bytes at `offset`. Uses O_DIRECT when in effect and offset, size and
  // address are all 4096-aligned, else the buffered descriptor. Throws Error naming the file on a
  // read error or on end of file before dst is full.
  void read_exact(uint64_t offset, std::span<std::byte> dst) const;

 private:
  File() = default;
  std::filesystem::path path_;
  uint64_t size_ = 0;
  int fd_ = -1;
  int direct_fd_ = -1;
};

}  // namespace k3::io
