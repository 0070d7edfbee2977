#include "io/safetensors_writer.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <unordered_set>
#include <utility>

#include "io/aligned.hpp"
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

int data_order_rank(DType d) {
  switch (d) {
    case DType::F32:
      return 0;
    case DType::F16:
      return 1;
    case DType::BF16:
      return 2;
    case DType::U8:
      return 3;
  }
  return 4;
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
                                     const Metadata& metadata, Mode mode)
    : path_(std::move(path)), tensors_(std::move(tensors)), layout_(layout_shard(tensors_, metadata)) {
  const std::filesystem::path tmp = partial_path(path_);
  constexpr int kFlags = O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC;
  // O_DIRECT moves the data by DMA from our buffers: no page-cache copy, nothing left cached.
  // Filesystems that refuse it (tmpfs on older kernels) get buffered writes.
  if (mode == Mode::direct_preferred) {
    fd_ = ::open(tmp.c_str(), kFlags | O_DIRECT, 0644);
    direct_ = fd_ >= 0;
  }
  if (mode == Mode::buffered || (fd_ < 0 && errno == EINVAL)) fd_ = ::open(tmp.c_str(), kFlags, 0644);
  if (fd_ < 0) throw runtime_error(sys_error("create", tmp, errno));
  committed_ = false;
  try {
    if (direct_) stage_ = AlignedBuffer(kStage, kDirectAlign);
    std::string prefix(8, '\0');
    const uint64_t n = layout_.header.size();
    for (int i = 0; i < 8; ++i) prefix[i] = static_cast<char>((n >> (8 * i)) & 0xFF);
    put(std::as_bytes(std::span(prefix.data(), prefix.size())));
    put(std::as_bytes(std::span(layout_.header.data(), layout_.header.size())));
  } catch (...) {
    discard();
    throw;
  }
}

SafetensorsWriter::SafetensorsWriter(SafetensorsWriter&& o) noexcept {
  swap(o);
}

SafetensorsWriter& SafetensorsWriter::operator=(SafetensorsWriter&& o) noexcept {
  if (this != &o) {
    discard();
    swap(o);
  }
  return *this;
}

void SafetensorsWriter::swap(SafetensorsWriter& o) noexcept {
  std::swap(path_, o.path_);
  std::swap(tensors_, o.tensors_);
  std::swap(layout_, o.layout_);
  std::swap(written_, o.written_);
  std::swap(fd_, o.fd_);
  std::swap(direct_, o.direct_);
  std::swap(stage_, o.stage_);
  std::swap(staged_, o.staged_);
  std::swap(started_, o.started_);
  std::swap(settled_, o.settled_);
  std::swap(finished_, o.finished_);
  std::swap(committed_, o.committed_);
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
  stage_ = AlignedBuffer();
}

void SafetensorsWriter::write_all(const std::byte* p, size_t n) {
  while (n > 0) {
    // One syscall moves at most 1 GiB (Linux caps a write just under 2 GiB anyway).
    const ssize_t w = ::write(fd_, p, std::min<size_t>(n, size_t{1} << 30));
    if (w < 0) {
      if (errno == EINTR) continue;
      if (errno == EINVAL && direct_) {
        // Accepted at open, refused at write: carry on buffered from here (same file offset).
        ::fcntl(fd_, F_SETFL, ::fcntl(fd_, F_GETFL) & ~O_DIRECT);
        direct_ = false;
        continue;
      }
      throw runtime_error(sys_error("write", partial_path(path_), errno));
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
}

// Direct mode: bytes go straight out when they start at an aligned address and nothing is staged
// (the synth pipeline arranges that for all but a shard's first block), else through the stage,
// which is written whenever full. Every write is a multiple of 4096 at a 4096-aligned offset.
void SafetensorsWriter::put(std::span<const std::byte> bytes) {
  while (!bytes.empty()) {
    if (!direct_) {
      write_all(bytes.data(), bytes.size());
      stream_out();
      return;
    }
    if (staged_ == 0 && bytes.size() >= kDirectAlign &&
        reinterpret_cast<uintptr_t>(bytes.data()) % kDirectAlign == 0) {
      const size_t n = align_down(bytes.size(), kDirectAlign);
      write_all(bytes.data(), n);
      bytes = bytes.subspan(n);
      continue;
    }
    const size_t take = std::min(stage_.size() - staged_, bytes.size());
    std::memcpy(stage_.data() + staged_, bytes.data(), take);
    staged_ += take;
    bytes = bytes.subspan(take);
    if (staged_ == stage_.size()) {
      write_all(stage_.data(), staged_);
      staged_ = 0;
    }
  }
}

// Writes what is staged, padded with zeros to the alignment, then cuts the file to its size.
void SafetensorsWriter::flush_stage_and_truncate(uint64_t size) {
  if (staged_ > 0) {
    const size_t padded = align_up(staged_, kDirectAlign);
    std::memset(stage_.data() + staged_, 0, padded - staged_);
    write_all(stage_.data(), padded);
    staged_ = 0;
  }
  if (::ftruncate(fd_, static_cast<off_t>(size)) != 0)
    throw runtime_error(sys_error("size", partial_path(path_), errno));
}

void SafetensorsWriter::append(std::span<const std::byte> bytes) {
  if (fd_ < 0 || finished_) throw runtime_error(fmt::format("{}: append after finish", path_.string()));
  if (bytes.size() > layout_.data_bytes - written_)
    throw runtime_error(fmt::format("{}: {} bytes appended past the declared {} data bytes", path_.string(),
                                    written_ + bytes.size(), layout_.data_bytes));
  put(bytes);
  written_ += bytes.size();
}

// Buffered mode only: start writing each appended range at once and, a window behind, wait for
// it and drop it from the page cache. Dirty memory stays bounded on multi-GB shards and the
// flush in commit() has little left to do.
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

void SafetensorsWriter::end(uint64_t expected_written) {
  if (fd_ < 0 || finished_) throw runtime_error(fmt::format("{}: finished twice", path_.string()));
  const std::filesystem::path tmp = partial_path(path_);
  if (written_ != expected_written)
    throw runtime_error(
        fmt::format("{}: {} of {} data bytes written", tmp.string(), written_, expected_written));
  if (direct_ || written_ < layout_.data_bytes) {
    flush_stage_and_truncate(layout_.file_size());
  } else {
    // Start writeback of the tail now; commit() waits for it, so finished shards flush together.
    ::sync_file_range(fd_, static_cast<off_t>(started_), 0, SYNC_FILE_RANGE_WRITE);
  }
  const int fd = std::exchange(fd_, -1);
  stage_ = AlignedBuffer();
  if (::close(fd) != 0) throw runtime_error(sys_error("close", tmp, errno));
  finished_ = true;
}

void SafetensorsWriter::finish() {
  end(layout_.data_bytes);
}

void SafetensorsWriter::finish_sparse() {
  end(0);
}

void SafetensorsWriter::commit() {
  if (!finished_) throw runtime_error(fmt::format("{}: commit before finish", path_.string()));
  if (committed_) return;
  const std::filesystem::path tmp = partial_path(path_);
  // Durable before visible: flush data and size, drop any cached pages (a freshly written
  // checkpoint should read cold), then rename.
  const int fd = ::open(tmp.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw runtime_error(sys_error("reopen", tmp, errno));
  if (::fdatasync(fd) != 0) {
    const int err = errno;
    ::close(fd);
    throw runtime_error(sys_error("flush", tmp, err));
  }
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
  if (::rename(tmp.c_str(), path_.c_str()) != 0) throw runtime_error(sys_error("rename into", path_, errno));
  committed_ = true;
}

}  // namespace k3::io
