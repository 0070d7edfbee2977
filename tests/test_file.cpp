// Positioned reads: O_DIRECT where the filesystem takes it, buffered fallback on tmpfs, unaligned
// ranges, reads larger than one syscall, end of file named in the error.
#include <doctest/doctest.h>
#include <fcntl.h>
#include <linux/magic.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "io/aligned.hpp"
#include "io/error.hpp"
#include "io/file.hpp"

using k3::io::AlignedBuffer;
using k3::io::File;
namespace fs = std::filesystem;

namespace {

std::byte pattern(uint64_t k) {
  return std::byte((k * 131 + 7) & 0xFF);
}

// A file of `size` bytes holding pattern(k) at every offset k in `ranges` (a hole elsewhere).
void make_file(const fs::path& p, uint64_t size, std::vector<std::pair<uint64_t, uint64_t>> ranges) {
  const int fd = ::open(p.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  REQUIRE(fd >= 0);
  REQUIRE(::ftruncate(fd, static_cast<off_t>(size)) == 0);
  for (auto [b, e] : ranges) {
    std::vector<std::byte> buf(e - b);
    for (uint64_t k = b; k < e; ++k) buf[k - b] = pattern(k);
    REQUIRE(::pwrite(fd, buf.data(), buf.size(), static_cast<off_t>(b)) == static_cast<ssize_t>(buf.size()));
  }
  ::close(fd);
}

bool is_tmpfs(const fs::path& dir) {
  struct statfs s {};
  return ::statfs(dir.c_str(), &s) == 0 && s.f_type == TMPFS_MAGIC;
}

bool known_direct_fs(const fs::path& dir) {
  struct statfs s {};
  if (::statfs(dir.c_str(), &s) != 0) return false;
  return s.f_type == EXT4_SUPER_MAGIC || s.f_type == XFS_SUPER_MAGIC || s.f_type == BTRFS_SUPER_MAGIC;
}

// A scratch directory on a disk filesystem: /tmp or /var/tmp unless tmpfs, else the working dir
// (ctest runs the tests in the build directory).
fs::path disk_dir() {
  for (fs::path d : {fs::path("/tmp"), fs::path("/var/tmp"), fs::current_path()}) {
    if (fs::is_directory(d) && !is_tmpfs(d)) return d;
  }
  return fs::current_path();
}

struct Scratch {
  fs::path path;
  explicit Scratch(const fs::path& dir, const char* tag)
      : path(dir / (std::string("k3_file_") + tag + "_" + std::to_string(::getpid()))) {}
  ~Scratch() { fs::remove(path); }
};

void check_pattern(std::span<const std::byte> got, uint64_t offset) {
  size_t bad = 0;
  for (size_t i = 0; i < got.size(); ++i) bad += got[i] != pattern(offset + i);
  CHECK(bad == 0);
}

void exercise_reads(const File& f) {
  // Aligned: may go through O_DIRECT.
  AlignedBuffer a(8192);
  f.read_exact(4096, a.bytes());
  check_pattern(a.bytes(), 4096);
  // Unaligned offset, size and address: always buffered.
  std::vector<std::byte> u(1001);
  f.read_exact(3, std::span(u).subspan(1, 1000));
  check_pattern(std::span(u).subspan(1, 1000), 3);
  // Aligned start, unaligned length running exactly to the end of the file.
  AlignedBuffer t(f.size() - 8192);
  f.read_exact(8192, t.bytes().first(f.size() - 8192));
  check_pattern(t.bytes().first(f.size() - 8192), 8192);
  // Zero bytes at the end is fine.
  f.read_exact(f.size(), {});
}

bool shm_is_tmpfs() {
  return fs::is_directory("/dev/shm") && is_tmpfs("/dev/shm");
}

}  // namespace

// Without a tmpfs at /dev/shm the case is skipped, and doctest's summary counts it as skipped.
TEST_CASE("tmpfs: direct_preferred reads correctly whether or not the kernel takes O_DIRECT there" *
          doctest::skip(!shm_is_tmpfs())) {
  if (!shm_is_tmpfs()) {  // reached only under --no-skip
    FAIL("no tmpfs at /dev/shm: this case cannot run here");
  }
  Scratch s("/dev/shm", "tmpfs");
  make_file(s.path, 5 * 4096 + 123, {{0, 5 * 4096 + 123}});
  const File f = File::open_read(s.path, File::Mode::direct_preferred);
  // tmpfs refuses O_DIRECT before Linux 6.6 (EINVAL at open): the buffered descriptor serves all
  // reads. Newer kernels accept it; both must read the same bytes.
  if (f.direct()) {
    MESSAGE("this kernel's tmpfs accepts O_DIRECT; the open-time fallback is not exercised here");
  } else {
    CHECK(f.direct_fd() == -1);
  }
  CHECK(f.buffered_fd() >= 0);
  CHECK(f.size() == 5 * 4096 + 123);
  exercise_reads(f);
}

TEST_CASE("a disk filesystem takes O_DIRECT; aligned and unaligned reads return the same bytes") {
  const fs::path dir = disk_dir();
  Scratch s(dir, "disk");
  make_file(s.path, 5 * 4096 + 123, {{0, 5 * 4096 + 123}});
  const File f = File::open_read(s.path, File::Mode::direct_preferred);
  if (known_direct_fs(dir)) {
    CHECK(f.direct());
  } else {
    MESSAGE(dir.string() << " is not ext4/xfs/btrfs; O_DIRECT " << (f.direct() ? "accepted" : "refused"));
  }
  exercise_reads(f);
  const File b = File::open_read(s.path, File::Mode::buffered);
  CHECK_FALSE(b.direct());
  exercise_reads(b);
}

TEST_CASE("end of file before the span is full is an Error naming the file") {
  Scratch s(disk_dir(), "eof");
  make_file(s.path, 10000, {{0, 10000}});
  for (auto mode : {File::Mode::buffered, File::Mode::direct_preferred}) {
    const File f = File::open_read(s.path, mode);
    AlignedBuffer a(8192);
    try {
      f.read_exact(4096, a.bytes());
      FAIL("read past the end succeeded");
    } catch (const k3::io::Error& e) {
      const std::string m = e.what();
      CHECK(m.find(s.path.string()) != std::string::npos);
      CHECK(m.find("end of file") != std::string::npos);
      CHECK(m.find('\n') == std::string::npos);
    }
    // Nothing was lost: the bytes that existed were still read correctly.
    check_pattern(a.bytes().first(10000 - 4096), 4096);
    std::vector<std::byte> one(1);
    CHECK_THROWS_AS(f.read_exact(10000, one), k3::io::Error);
    CHECK_THROWS_AS(f.read_exact(UINT64_MAX - 2, one), k3::io::Error);
  }
}

TEST_CASE("open errors name the path") {
  try {
    File::open_read("/nonexistent/k3/shard.safetensors", File::Mode::buffered);
    FAIL("opened a missing file");
  } catch (const k3::io::Error& e) {
    CHECK(std::string(e.what()).find("/nonexistent/k3/shard.safetensors") != std::string::npos);
  }
  CHECK_THROWS_AS(File::open_read("/tmp", File::Mode::direct_preferred), k3::io::Error);
}

TEST_CASE("move transfers the descriptors") {
  Scratch s(disk_dir(), "move");
  make_file(s.path, 8192, {{0, 8192}});
  File a = File::open_read(s.path, File::Mode::direct_preferred);
  const int fd = a.buffered_fd();
  File b(std::move(a));
  CHECK(b.buffered_fd() == fd);
  CHECK(a.buffered_fd() == -1);
  CHECK(a.direct_fd() == -1);
  std::vector<std::byte> v(100);
  b.read_exact(50, v);
  check_pattern(v, 50);
  CHECK_THROWS_AS(a.read_exact(0, v), k3::io::Error);
}

TEST_CASE("a read larger than one syscall (1 GiB) is split and resumed correctly") {
  // Sparse: only the bytes around the chunk boundary and the tail hold data.
  const uint64_t gib = k3::io::kMaxReadSyscall;
  const uint64_t size = gib + 3 * 4096 + 5;
  Scratch s(disk_dir(), "big");
  make_file(s.path, size, {{0, 4096}, {gib - 4096, gib + 4096}, {size - 5000, size}});
  const File f = File::open_read(s.path, File::Mode::direct_preferred);
  AlignedBuffer buf(size);
  f.read_exact(0, buf.bytes().first(size));
  check_pattern(buf.bytes().first(4096), 0);
  check_pattern(buf.bytes().subspan(gib - 4096, 8192), gib - 4096);
  check_pattern(buf.bytes().subspan(size - 5000, 5000), size - 5000);
  size_t nonzero = 0;
  for (uint64_t k = 4096; k < gib - 4096; k += 4093) nonzero += buf.data()[k] != std::byte{0};
  CHECK(nonzero == 0);
}
