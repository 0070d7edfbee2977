#include "io/file.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "io/aligned.hpp"
#include "io/error.hpp"

namespace k3::io {

namespace {

Error file_error(const std::filesystem::path& p, const std::string& what) {
  return runtime_error(fmt::format("{}: {}", p.string(), what));
}

bool aligned(uint64_t v) {
  return v % kDirectAlign == 0;
}

// Some filesystems accept O_DIRECT at open and refuse it at read time; one aligned read of the
// first block tells. The direct descriptor is kept only if that read succeeds.
bool direct_read_works(int fd) {
  void* p = nullptr;
  if (::posix_memalign(&p, kDirectAlign, kDirectAlign) != 0) return false;
  ssize_t n;
  do {
    n = ::pread(fd, p, kDirectAlign, 0);
  } while (n < 0 && errno == EINTR);
  std::free(p);
  return n >= 0;
}

}  // namespace

File File::open_read(const std::filesystem::path& path, Mode mode) {
  File f;
  f.path_ = path;
  f.fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (f.fd_ < 0) throw file_error(path, fmt::format("cannot open: {}", std::strerror(errno)));
  struct stat st {};
  if (::fstat(f.fd_, &st) != 0) throw file_error(path, fmt::format("cannot stat: {}", std::strerror(errno)));
  if (S_ISDIR(st.st_mode)) throw file_error(path, "is a directory, not a file");
  f.size_ = static_cast<uint64_t>(st.st_size);
  if (mode == Mode::direct_preferred) {
    // tmpfs and others refuse O_DIRECT (EINVAL): the buffered descriptor serves every read then.
    const int d = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_DIRECT);
    if (d >= 0 && direct_read_works(d)) {
      f.direct_fd_ = d;
    } else if (d >= 0) {
      ::close(d);
    }
  }
  return f;
}

File::File(File&& o) noexcept
    : path_(std::move(o.path_)),
      size_(o.size_),
      fd_(std::exchange(o.fd_, -1)),
      direct_fd_(std::exchange(o.direct_fd_, -1)) {}

File& File::operator=(File&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    if (direct_fd_ >= 0) ::close(direct_fd_);
    path_ = std::move(o.path_);
    size_ = o.size_;
    fd_ = std::exchange(o.fd_, -1);
    direct_fd_ = std::exchange(o.direct_fd_, -1);
  }
  return *this;
}

File::~File() {
  if (fd_ >= 0) ::close(fd_);
  if (direct_fd_ >= 0) ::close(direct_fd_);
}

void File::read_exact(uint64_t offset, std::span<std::byte> dst) const {
  if (fd_ < 0) throw file_error(path_, "read from a closed file");
  uint64_t end = 0;
  if (__builtin_add_overflow(offset, uint64_t{dst.size()}, &end) || end > uint64_t{INT64_MAX}) {
    throw file_error(path_, fmt::format("read of {} bytes at offset {} overflows", dst.size(), offset));
  }
  std::byte* p = dst.data();
  uint64_t off = offset;
  size_t left = dst.size();
  bool direct = direct_fd_ >= 0;
  while (left > 0) {
    const size_t want = std::min(left, kMaxReadSyscall);
    const bool use_direct =
        direct && aligned(off) && aligned(want) && aligned(reinterpret_cast<uintptr_t>(p));
    const ssize_t n = ::pread(use_direct ? direct_fd_ : fd_, p, want, static_cast<off_t>(off));
    if (n < 0) {
      if (errno == EINTR) continue;
      if (use_direct && errno == EINVAL) {  // this range refused O_DIRECT after all
        direct = false;
        continue;
      }
      throw file_error(path_, fmt::format("read of {} bytes at offset {} failed at offset {}: {}", dst.size(),
                                          offset, off, std::strerror(errno)));
    }
    if (n == 0) {
      throw file_error(path_,
                       fmt::format("unexpected end of file at offset {} reading {} bytes at offset {} ({} "
                                   "bytes short)",
                                   off, dst.size(), offset, left));
    }
    // A short read (signal, the kernel's 0x7ffff000 cap, O_DIRECT tail) resumes where it stopped.
    p += n;
    off += static_cast<uint64_t>(n);
    left -= static_cast<size_t>(n);
  }
}

}  // namespace k3::io
