#include "io/safetensors_writer.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <unordered_set>

#include "io/error.hpp"

namespace k3::io {

namespace {

std::string sys_error(const char* what, const std::filesystem::path& p, int err) {
  return fmt::format("cannot {} {}: {}", what, p.string(), std::strerror(err));
}

}  // namespace

uint64_t TensorEntry::numel() const {
  uint64_t n = 1;
  for (uint64_t d : shape) n *= d;
  return n;
}

std::string json_quote(std::string_view s) {
  std::string out;
  out.reserve(s.size() + 2);
  out.push_back('"');
  for (char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\r':
        out += "\\r";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20)
          out += fmt::format("\\u{:04x}", static_cast<unsigned>(static_cast<unsigned char>(c)));
        else
          out.push_back(c);
    }
  }
  out.push_back('"');
  return out;
}

ShardLayout layout_shard(std::span<const TensorEntry> tensors, const Metadata& metadata) {
  ShardLayout l;
  std::string& h = l.header;
  h.reserve(64 + tensors.size() * 128);
  h += '{';
  bool first = true;
  if (!metadata.empty()) {
    h += "\"__metadata__\":{";
    for (size_t i = 0; i < metadata.size(); ++i) {
      if (i) h += ',';
      h += json_quote(metadata[i].first);
      h += ':';
      h += json_quote(metadata[i].second);
    }
    h += '}';
    first = false;
  }
  std::unordered_set<std::string_view> seen;
  seen.reserve(tensors.size());
  l.offsets.reserve(tensors.size());
  for (const TensorEntry& t : tensors) {
    if (t.name.empty() || t.name == "__metadata__")
      throw usage_error(fmt::format("safetensors writer: invalid tensor name '{}'", t.name));
    if (!seen.insert(t.name).second)
      throw usage_error(fmt::format("safetensors writer: duplicate tensor {}", t.name));
    if (t.shape.size() > 4)
      throw usage_error(
          fmt::format("safetensors writer: {} has rank {} (at most 4)", t.name, t.shape.size()));
    const uint64_t begin = l.data_bytes, end = begin + t.nbytes();
    if (!first) h += ',';
    first = false;
    h += json_quote(t.name);
    h += ":{\"dtype\":\"";
    h += dtype_name(t.dtype);
    h += "\",\"shape\":[";
    for (size_t i = 0; i < t.shape.size(); ++i) {
      if (i) h += ',';
      h += fmt::format("{}", t.shape[i]);
    }
    h += fmt::format("],\"data_offsets\":[{},{}]}}", begin, end);
    l.offsets.push_back(begin);
    l.data_bytes = end;
  }
  h += '}';
  // Padding with spaces (valid JSON whitespace) puts the data start on an 8-byte boundary.
  h.append((8 - h.size() % 8) % 8, ' ');
  return l;
}

std::filesystem::path partial_path(const std::filesystem::path& final_path) {
  std::filesystem::path p = final_path;
  p += ".partial";
  return p;
}

SafetensorsWriter::SafetensorsWriter(std::filesystem::path path, std::vector<TensorEntry> tensors,
                                     const Metadata& metadata)
    : path_(std::move(path)), tensors_(std::move(tensors)), layout_(layout_shard(tensors_, metadata)) {
  const std::filesystem::path tmp = partial_path(path_);
  fd_ = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd_ < 0) throw runtime_error(sys_error("create", tmp, errno));
  std::string prefix(8, '\0');
  uint64_t n = layout_.header.size();
  for (int i = 0; i < 8; ++i) prefix[i] = static_cast<char>((n >> (8 * i)) & 0xFF);
  try {
    append_raw(prefix);
    append_raw(layout_.header);
  } catch (...) {
    close_fd();
    ::unlink(tmp.c_str());
    throw;
  }
}

SafetensorsWriter::SafetensorsWriter(SafetensorsWriter&& o) noexcept
    : path_(std::move(o.path_)),
      tensors_(std::move(o.tensors_)),
      layout_(std::move(o.layout_)),
      written_(o.written_),
      started_(o.started_),
      settled_(o.settled_),
      fd_(o.fd_),
      finished_(o.finished_),
      committed_(o.committed_) {
  o.fd_ = -1;
  o.committed_ = true;  // the moved-from object owns no file
}

SafetensorsWriter& SafetensorsWriter::operator=(SafetensorsWriter&& o) noexcept {
  if (this != &o) {
    discard();
    path_ = std::move(o.path_);
    tensors_ = std::move(o.tensors_);
    layout_ = std::move(o.layout_);
    written_ = o.written_;
    started_ = o.started_;
    settled_ = o.settled_;
    fd_ = o.fd_;
    finished_ = o.finished_;
    committed_ = o.committed_;
    o.fd_ = -1;
    o.committed_ = true;
  }
  return *this;
}

SafetensorsWriter::~SafetensorsWriter() {
  discard();
}

void SafetensorsWriter::discard() noexcept {
  close_fd();
  if (!committed_ && !path_.empty()) ::unlink(partial_path(path_).c_str());
  committed_ = true;
}

void SafetensorsWriter::close_fd() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

void SafetensorsWriter::append_raw(std::string_view bytes) {
  append_fd(std::as_bytes(std::span(bytes.data(), bytes.size())));
}

void SafetensorsWriter::append_fd(std::span<const std::byte> bytes) {
  const std::byte* p = bytes.data();
  size_t left = bytes.size();
  while (left > 0) {
    // One syscall moves at most 1 GiB (Linux caps a write just under 2 GiB anyway).
    ssize_t n = ::write(fd_, p, std::min<size_t>(left, size_t{1} << 30));
    if (n < 0) {
      if (errno == EINTR) continue;
      throw runtime_error(sys_error("write", partial_path(path_), errno));
    }
    p += n;
    left -= static_cast<size_t>(n);
  }
}

void SafetensorsWriter::append(std::span<const std::byte> bytes) {
  if (fd_ < 0 || finished_) throw runtime_error(fmt::format("{}: append after finish", path_.string()));
  if (bytes.size() > layout_.data_bytes - written_)
    throw runtime_error(fmt::format("{}: {} bytes appended past the declared {} data bytes", path_.string(),
                                    written_ + bytes.size(), layout_.data_bytes));
  append_fd(bytes);
  written_ += bytes.size();
  stream_out();
}

// Streaming writeback: start writing each appended range at once and, a window behind, wait for
// it and drop it from the page cache. Dirty memory stays bounded on multi-GB shards and the final
// flush in finish() has little left to do.
void SafetensorsWriter::stream_out() {
  constexpr uint64_t kWindow = uint64_t{64} << 20;
  const uint64_t end = layout_.data_start() + written_;
  if (end - started_ >= (uint64_t{8} << 20)) {
    ::sync_file_range(fd_, static_cast<off_t>(started_), static_cast<off_t>(end - started_),
                      SYNC_FILE_RANGE_WRITE);
    started_ = end;
  }
  if (started_ >= settled_ + 2 * kWindow) {
    const uint64_t upto = started_ - kWindow;
    ::sync_file_range(fd_, static_cast<off_t>(settled_), static_cast<off_t>(upto - settled_),
                      SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE | SYNC_FILE_RANGE_WAIT_AFTER);
    ::posix_fadvise(fd_, static_cast<off_t>(settled_), static_cast<off_t>(upto - settled_),
                    POSIX_FADV_DONTNEED);
    settled_ = upto;
  }
}

void SafetensorsWriter::finish() {
  if (fd_ < 0 || finished_) throw runtime_error(fmt::format("{}: finished twice", path_.string()));
  const std::filesystem::path tmp = partial_path(path_);
  if (written_ != layout_.data_bytes)
    throw runtime_error(
        fmt::format("{}: {} of {} data bytes written", tmp.string(), written_, layout_.data_bytes));
  if (::fdatasync(fd_) != 0) throw runtime_error(sys_error("flush", tmp, errno));
  ::posix_fadvise(fd_, 0, 0, POSIX_FADV_DONTNEED);
  if (::close(fd_) != 0) {
    fd_ = -1;
    throw runtime_error(sys_error("close", tmp, errno));
  }
  fd_ = -1;
  finished_ = true;
}

void SafetensorsWriter::finish_sparse() {
  if (fd_ < 0 || finished_) throw runtime_error(fmt::format("{}: finished twice", path_.string()));
  const std::filesystem::path tmp = partial_path(path_);
  if (written_ != 0)
    throw runtime_error(fmt::format("{}: sparse finish after {} data bytes", tmp.string(), written_));
  if (::ftruncate(fd_, static_cast<off_t>(layout_.file_size())) != 0)
    throw runtime_error(sys_error("extend", tmp, errno));
  if (::close(fd_) != 0) {
    fd_ = -1;
    throw runtime_error(sys_error("close", tmp, errno));
  }
  fd_ = -1;
  finished_ = true;
}

void SafetensorsWriter::commit() {
  if (!finished_) throw runtime_error(fmt::format("{}: commit before finish", path_.string()));
  if (committed_) return;
  if (::rename(partial_path(path_).c_str(), path_.c_str()) != 0)
    throw runtime_error(sys_error("rename into", path_, errno));
  committed_ = true;
}

}  // namespace k3::io
