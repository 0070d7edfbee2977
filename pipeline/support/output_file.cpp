#include "pipeline/support/output_file.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "io/error.hpp"

namespace k3::pipeline {

void write_file_atomic(const std::filesystem::path& path, std::span<const std::byte> bytes) {
  const std::filesystem::path tmp = path.string() + fmt::format(".tmp.{}", ::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0)
    throw io::runtime_error(fmt::format("cannot write {}: {}", path.string(), std::strerror(errno)));
  const std::byte* p = bytes.data();
  size_t left = bytes.size();
  int err = 0;
  while (left > 0) {
    const ssize_t n = ::write(fd, p, std::min<size_t>(left, size_t{1} << 30));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      err = n < 0 ? errno : EIO;
      break;
    }
    p += n;
    left -= static_cast<size_t>(n);
  }
  if (err == 0 && ::fsync(fd) != 0) err = errno;
  if (::close(fd) != 0 && err == 0) err = errno;
  if (err == 0 && ::rename(tmp.c_str(), path.c_str()) != 0) err = errno;
  if (err != 0) {
    ::unlink(tmp.c_str());
    throw io::runtime_error(fmt::format("cannot write {}: {}", path.string(), std::strerror(err)));
  }
}

void check_writable(const std::filesystem::path& path, std::string_view flag) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    throw io::usage_error(fmt::format("{} {}: is a directory", flag, path.string()));
  const std::filesystem::path dir = path.has_parent_path() ? path.parent_path() : ".";
  if (!std::filesystem::is_directory(dir, ec))
    throw io::usage_error(
        fmt::format("{} {}: directory {} does not exist", flag, path.string(), dir.string()));
  const std::filesystem::path tmp = path.string() + fmt::format(".tmp.{}", ::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0)
    throw io::usage_error(
        fmt::format("{} {}: cannot be written: {}", flag, path.string(), std::strerror(errno)));
  ::close(fd);
  ::unlink(tmp.c_str());
}

void check_input_dir(const std::filesystem::path& dir, std::string_view what) {
  std::error_code ec;
  const std::filesystem::file_status st = std::filesystem::status(dir, ec);
  if (!std::filesystem::exists(st))
    throw io::usage_error(fmt::format("{} {}: does not exist", what, dir.string()));
  if (!std::filesystem::is_directory(st))
    throw io::usage_error(fmt::format("{} {}: is not a directory", what, dir.string()));
}

void check_input_file(const std::filesystem::path& file, std::string_view what) {
  std::error_code ec;
  const std::filesystem::file_status st = std::filesystem::status(file, ec);
  if (!std::filesystem::exists(st))
    throw io::usage_error(fmt::format("{} {}: does not exist", what, file.string()));
  if (std::filesystem::is_directory(st))
    throw io::usage_error(fmt::format("{} {}: is a directory, not a file", what, file.string()));
}

void check_model_dir(const std::filesystem::path& dir, bool config_given) {
  check_input_dir(dir, "MODEL_DIR");
  std::error_code ec;
  if (!config_given && !std::filesystem::exists(dir / "config.json", ec))
    throw io::usage_error(
        fmt::format("MODEL_DIR {}: no config.json, not a checkpoint directory", dir.string()));
}

void check_trunk_dir(const std::filesystem::path& dir) {
  check_input_dir(dir, "--trunk");
  std::error_code ec;
  if (!std::filesystem::exists(dir / "trunk.json", ec))
    throw io::usage_error(fmt::format(
        "--trunk {}: no trunk.json, not a packed trunk (k3flow pack-trunk MODEL_DIR {} writes one)",
        dir.string(), dir.string()));
}

void write_file_atomic(const std::filesystem::path& path, std::string_view text) {
  write_file_atomic(path, std::as_bytes(std::span(text.data(), text.size())));
}

}  // namespace k3::pipeline
