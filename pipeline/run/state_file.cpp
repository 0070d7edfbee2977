#include "pipeline/run/state_file.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <string>

#include "io/error.hpp"

namespace k3::pipeline {

namespace {

constexpr char kMagic[4] = {'K', '3', 'S', 'T'};
constexpr int32_t kVersion = 1;

// Little-endian field access (the format is defined little-endian; x86-64 and AArch64 Linux are).
template <class T>
void put(std::byte* b, size_t at, T v) {
  std::memcpy(b + at, &v, sizeof v);
}
template <class T>
T get(const std::byte* b, size_t at) {
  T v;
  std::memcpy(&v, b + at, sizeof v);
  return v;
}

uint64_t expected_size(const StateHeader& h) {
  return kStateHeaderBytes + 4ull * static_cast<uint64_t>(h.nseq) +
         4ull * static_cast<uint64_t>(h.kper) * static_cast<uint64_t>(h.n_bound) +
         4ull * static_cast<uint64_t>(h.cached) * static_cast<uint64_t>(h.kvpp + h.ropepp) *
             static_cast<uint64_t>(h.n_mla);
}

[[noreturn]] void refuse(const std::filesystem::path& p, const std::string& why) {
  throw io::runtime_error(fmt::format("--load-state {}: {}", p.string(), why));
}

// A file written front to back through one fixed buffer into a temporary name in the destination's
// directory; commit() fsyncs it and renames it over the destination. Until then the destination is
// untouched, and a writer destroyed uncommitted (any failure) removes the temporary.
class StreamedFile {
 public:
  explicit StreamedFile(const std::filesystem::path& path)
      : path_(path), tmp_(path.string() + fmt::format(".tmp.{}", ::getpid())), buf_(kStateWriteBuffer) {
    std::error_code ec;
    if (std::filesystem::is_directory(path, ec)) fail(EISDIR);
    fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd_ < 0) fail(errno);
  }
  ~StreamedFile() {
    if (fd_ >= 0) ::close(fd_);
    if (!committed_) ::unlink(tmp_.c_str());
  }
  StreamedFile(const StreamedFile&) = delete;
  StreamedFile& operator=(const StreamedFile&) = delete;

  // Small pieces gather in the buffer; a piece at least as large as the buffer goes straight from
  // the caller's memory, so no piece is ever copied whole.
  void write(const void* src, size_t n) {
    if (n == 0) return;  // an empty seq's data() may be null, which memcpy must not be given
    const auto* p = static_cast<const std::byte*>(src);
    if (used_ + n > buf_.size()) flush();
    if (n >= buf_.size()) {
      write_fully(p, n);
    } else {
      std::memcpy(buf_.data() + used_, p, n);
      used_ += n;
    }
  }
  void zeros(uint64_t n) {
    while (n > 0) {
      if (used_ == buf_.size()) flush();
      const size_t k = size_t(std::min<uint64_t>(n, buf_.size() - used_));
      std::memset(buf_.data() + used_, 0, k);
      used_ += k;
      n -= k;
    }
  }
  uint64_t size() const { return written_ + used_; }

  void commit() {
    flush();
    if (::fsync(fd_) != 0) fail(errno);
    const int fd = fd_;
    fd_ = -1;
    if (::close(fd) != 0) fail(errno);
    if (::rename(tmp_.c_str(), path_.c_str()) != 0) fail(errno);
    committed_ = true;
    // The rename itself reaches the disk with the directory (best effort: not every file system
    // lets a directory be fsynced).
    const std::filesystem::path dir = path_.has_parent_path() ? path_.parent_path() : ".";
    const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
      ::fsync(dfd);
      ::close(dfd);
    }
  }

 private:
  [[noreturn]] void fail(int err) const {
    throw io::runtime_error(
        fmt::format("cannot write state file {}: {}", path_.string(), std::strerror(err ? err : EIO)));
  }
  void flush() {
    write_fully(buf_.data(), used_);
    used_ = 0;
  }
  void write_fully(const std::byte* p, size_t n) {
    while (n > 0) {
      const ssize_t w = ::write(fd_, p, std::min<size_t>(n, size_t{1} << 30));
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) fail(w < 0 ? errno : EIO);
      p += w;
      n -= size_t(w);
      written_ += uint64_t(w);
    }
  }

  std::filesystem::path path_, tmp_;
  std::vector<std::byte> buf_;
  size_t used_ = 0;
  uint64_t written_ = 0;
  int fd_ = -1;
  bool committed_ = false;
};

}  // namespace

std::array<int32_t, 12> state_fingerprint(const io::ModelConfig& c) {
  return {c.hidden,    c.n_layers, c.vocab,   c.kda_heads, c.kda_head_dim, c.conv_kernel,
          c.mla_heads, c.qk_nope,  c.qk_rope, c.v_head,    c.n_experts,    c.top_k};
}

StateHeader peek_state(const std::filesystem::path& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) refuse(path, "cannot open it");
  std::byte raw[kStateHeaderBytes];
  f.read(reinterpret_cast<char*>(raw), kStateHeaderBytes);
  if (f.gcount() != static_cast<std::streamsize>(kStateHeaderBytes) || std::memcmp(raw, kMagic, 4) != 0)
    refuse(path, "not a k3 state file (bad magic or shorter than its 96-byte header)");
  StateHeader h;
  h.version = get<int32_t>(raw, 4);
  if (h.version != kVersion)
    refuse(path, fmt::format("state version {}, this build reads {}", h.version, kVersion));
  for (size_t i = 0; i < 12; ++i) h.fingerprint[i] = get<int32_t>(raw, 8 + 4 * i);
  h.n_bound = get<int32_t>(raw, 56);
  h.n_mla = get<int32_t>(raw, 60);
  h.cached = get<int32_t>(raw, 64);
  h.nseq = get<int32_t>(raw, 68);
  h.kper = get<int64_t>(raw, 72);
  h.kvpp = get<int64_t>(raw, 80);
  h.ropepp = get<int64_t>(raw, 88);
  if (h.nseq < 0 || h.cached < 0 || h.cached > h.nseq || h.n_bound < 0 || h.n_mla < 0 || h.kper < 0 ||
      h.kvpp < 0 || h.ropepp < 0)
    refuse(path, "corrupt header (negative sizes or cached > nseq)");
  return h;
}

void load_state(const std::filesystem::path& path, const io::ModelConfig& c, stages::DecodeState& st,
                std::vector<int32_t>& seq) {
  const StateHeader h = peek_state(path);
  if (h.fingerprint != state_fingerprint(c))
    refuse(path,
           "written by a different model architecture (config fingerprint mismatch); restoring it would "
           "produce fluent, wrong output");
  if (h.n_bound != st.n_bound() || h.n_mla != st.n_mla())
    refuse(path, fmt::format("holds {} bound layers and {} MLA layers, this run has {} and {}", h.n_bound,
                             h.n_mla, st.n_bound(), st.n_mla()));
  if (static_cast<size_t>(h.kper) != st.kper() || static_cast<size_t>(h.kvpp) != st.kvpp() ||
      static_cast<size_t>(h.ropepp) != st.ropepp())
    refuse(path, "per-layer state sizes disagree with this model");
  if (static_cast<size_t>(h.cached) > st.capacity())
    refuse(path, fmt::format("holds {} positions, this run's KV cache holds {}", h.cached, st.capacity()));
  const uint64_t want = expected_size(h);
  std::error_code ec;
  const uint64_t have = std::filesystem::file_size(path, ec);
  if (ec) refuse(path, "cannot stat it");
  if (have < want) refuse(path, fmt::format("truncated: {} bytes, the header implies {}", have, want));
  if (have > want) refuse(path, fmt::format("{} bytes, the header implies {} (trailing data)", have, want));

  std::ifstream f(path, std::ios::binary);
  f.seekg(kStateHeaderBytes);
  auto read = [&](void* dst, size_t bytes) {
    f.read(static_cast<char*>(dst), static_cast<std::streamsize>(bytes));
    if (f.gcount() != static_cast<std::streamsize>(bytes))
      refuse(path, "truncated while reading its payload");
  };
  seq.assign(static_cast<size_t>(h.nseq), 0);
  read(seq.data(), seq.size() * 4);
  // The file holds kper floats for every bound layer; only the KDA layers' are state (an MLA
  // layer's slice is zero in files from every engine and has nowhere to go here).
  for (int l = 0; l < h.n_bound; ++l) {
    const std::span<float> kda = st.kda_layer(l);
    if (kda.empty())
      f.seekg(static_cast<std::streamoff>(4 * h.kper), std::ios::cur);
    else
      read(kda.data(), kda.size() * 4);
  }
  for (int m = 0; m < h.n_mla; ++m) read(st.kv_rows(m, h.cached).data(), st.kv_rows(m, h.cached).size() * 4);
  for (int m = 0; m < h.n_mla; ++m)
    read(st.rope_rows(m, h.cached).data(), st.rope_rows(m, h.cached).size() * 4);
  for (int32_t id : seq)
    if (id < 0 || id >= c.vocab) refuse(path, fmt::format("holds token id {} outside the vocabulary", id));
  st.cached = static_cast<size_t>(h.cached);
}

uint64_t save_state(const std::filesystem::path& path, const io::ModelConfig& c,
                    const std::vector<int32_t>& seq, stages::DecodeState& st) {
  StateHeader h;
  h.version = kVersion;
  h.fingerprint = state_fingerprint(c);
  h.n_bound = st.n_bound();
  h.n_mla = st.n_mla();
  h.cached = static_cast<int32_t>(st.cached);
  h.nseq = static_cast<int32_t>(seq.size());
  h.kper = static_cast<int64_t>(st.kper());
  h.kvpp = static_cast<int64_t>(st.kvpp());
  h.ropepp = static_cast<int64_t>(st.ropepp());

  std::byte head[kStateHeaderBytes] = {};
  std::memcpy(head, kMagic, 4);
  put(head, 4, h.version);
  for (size_t i = 0; i < 12; ++i) put(head, 8 + 4 * i, h.fingerprint[i]);
  put(head, 56, h.n_bound);
  put(head, 60, h.n_mla);
  put(head, 64, h.cached);
  put(head, 68, h.nseq);
  put(head, 72, h.kper);
  put(head, 80, h.kvpp);
  put(head, 88, h.ropepp);

  // Streamed from the state itself: nothing the size of the file is built in memory.
  StreamedFile out(path);
  out.write(head, sizeof head);
  out.write(seq.data(), seq.size() * 4);
  for (int l = 0; l < h.n_bound; ++l) {  // kper floats per bound layer; an MLA layer's are zero
    const std::span<const float> kda = st.kda_layer(l);
    if (kda.empty())
      out.zeros(4 * st.kper());
    else
      out.write(kda.data(), kda.size_bytes());
  }
  for (int m = 0; m < h.n_mla; ++m)
    out.write(st.kv_rows(m, st.cached).data(), st.kv_rows(m, st.cached).size_bytes());
  for (int m = 0; m < h.n_mla; ++m)
    out.write(st.rope_rows(m, st.cached).data(), st.rope_rows(m, st.cached).size_bytes());
  const uint64_t size = out.size();
  if (size != expected_size(h))  // the format's own size formula: a layout slip is caught here
    throw io::runtime_error(fmt::format("cannot write state file {}: wrote {} bytes, the header implies {}",
                                        path.string(), size, expected_size(h)));
  out.commit();
  return size;
}

}  // namespace k3::pipeline
