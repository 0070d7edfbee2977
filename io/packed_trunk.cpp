#include "io/packed_trunk.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <simdjson.h>
#include <sys/stat.h>
#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <future>
#include <optional>
#include <thread>

#include "io/aligned.hpp"
#include "io/env.hpp"
#include "io/error.hpp"
#include "io/released_tensors.hpp"
#include "io/safetensors_writer.hpp"

namespace fs = std::filesystem;

namespace k3::io {

// ---------------------------------------------------------------- layout

const TrunkTensor* TrunkLayer::find(std::string_view name) const {
  for (const TrunkTensor& t : tensors)
    if (t.name == name) return &t;
  return nullptr;
}

int trunk_layer_of(std::string_view name) {
  const NameOwner o = owner_of(name);
  return o.kind == NameOwner::Kind::layer_trunk ? o.layer : -1;
}

TrunkLayout layout_trunk(const ShardSet& shards, int n_layers) {
  TrunkLayout out;
  out.layers.resize(size_t(n_layers));
  out.sources.resize(size_t(n_layers));
  std::vector<std::vector<std::pair<std::string, TensorInfo>>> found(static_cast<size_t>(n_layers));
  shards.for_each([&](std::string_view name, const TensorInfo& t) {
    int l = trunk_layer_of(name);
    if (l < 0) return;
    if (l >= n_layers)
      throw runtime_error(fmt::format(
          "pack-trunk: tensor {} belongs to layer {}, but the config has {} layers", name, l, n_layers));
    found[size_t(l)].emplace_back(std::string(name), t);
  });
  uint64_t file_off = 0;
  for (int l = 0; l < n_layers; ++l) {
    auto& ts = found[size_t(l)];
    if (ts.empty())
      throw runtime_error(fmt::format("pack-trunk: layer {} has no tensors in the checkpoint ({} shards)", l,
                                      shards.shard_count()));
    // Shard order: the copy then reads each shard front to back.
    std::sort(ts.begin(), ts.end(), [](const auto& a, const auto& b) {
      return std::pair(a.second.shard, a.second.offset) < std::pair(b.second.shard, b.second.offset);
    });
    TrunkLayer& L = out.layers[size_t(l)];
    L.layer = l;
    L.file_off = file_off;
    uint64_t off = 0;
    for (auto& [name, info] : ts) {
      off = align_up(off, kTrunkTensorAlign);
      L.tensors.push_back({name, info.dtype, info.rank, info.shape, off, info.nbytes});
      out.sources[size_t(l)].push_back(info);
      off += info.nbytes;
    }
    L.nbytes = align_up(std::max<uint64_t>(off, 1), kTrunkAlign);
    L.stored_bytes = L.compressed_bytes = L.nbytes;
    file_off += L.nbytes;
  }
  out.file_bytes = file_off;
  return out;
}

TrunkSource trunk_source(const ShardSet& shards, const std::vector<std::vector<TensorInfo>>& sources) {
  TrunkSource src;
  for (uint32_t s = 0; s < shards.shard_count(); ++s) {
    TrunkSourceShard sh;
    sh.file = shards.shard_path(s).filename().string();
    sh.bytes = shards.shard_size(s);
    std::array<std::byte, 8> len_bytes{};
    if (sh.bytes < 8)
      throw runtime_error(
          fmt::format("trunk: {}: too short for a safetensors header", shards.shard_path(s).string()));
    shards.read_range(s, 0, len_bytes);
    uint64_t len;
    std::memcpy(&len, len_bytes.data(), 8);
    if (len > sh.bytes - 8)
      throw runtime_error(fmt::format("trunk: {}: header length {} runs past the end of the file",
                                      shards.shard_path(s).string(), len));
    std::vector<std::byte> header(size_t(8 + len));
    shards.read_range(s, 0, header);
    sh.header_xxh64 = xxh64(header);
    src.shards.push_back(std::move(sh));
  }
  std::vector<std::byte> sample(kTrunkSampleBytes);
  for (const auto& layer : sources) {
    Xxh64 h;
    for (const TensorInfo& t : layer) {
      auto part = std::span(sample).first(size_t(std::min<uint64_t>(t.nbytes, kTrunkSampleBytes)));
      shards.read_range(t.shard, t.offset, part);
      h.update(part);
    }
    src.layer_samples.push_back(h.digest());
  }
  return src;
}

// ---------------------------------------------------------------- writer

namespace {

constexpr size_t kStageBytes = size_t{64} << 20;

std::string trunk_json(const std::vector<TrunkLayer>& layers, const TrunkSource& src, codec::Codec codec) {
  const bool packed = codec != codec::Codec::none;
  std::string s = fmt::format(
      "{{\"format\":\"k3flow-trunk\",\"version\":{},\"n_layers\":{},\"align\":{},\"tensor_align\":{},"
      "\"checksum\":\"xxh64\",{}\n\"source\":{{\"sample_bytes\":{},\"shards\":[",
      packed ? 2 : 1, layers.size(), kTrunkAlign, kTrunkTensorAlign,
      packed ? fmt::format("\"codec\":\"{}\",", codec::codec_name(codec)) : "", kTrunkSampleBytes);
  for (size_t i = 0; i < src.shards.size(); ++i)
    s += fmt::format("{}{{\"file\":{},\"bytes\":{},\"header_xxh64\":\"{:016x}\"}}", i ? "," : "",
                     json_quote(src.shards[i].file), src.shards[i].bytes, src.shards[i].header_xxh64);
  s += "],\n\"layer_samples\":[";
  for (size_t i = 0; i < src.layer_samples.size(); ++i)
    s += fmt::format("{}\"{:016x}\"", i ? "," : "", src.layer_samples[i]);
  s += "]},\"layers\":[";
  for (size_t i = 0; i < layers.size(); ++i) {
    const TrunkLayer& L = layers[i];
    s += fmt::format("{}\n{{\"layer\":{},\"file_off\":{},\"nbytes\":{},\"xxh64\":\"{:016x}\",", i ? "," : "",
                     L.layer, L.file_off, L.nbytes, L.xxh64);
    if (packed)
      s += fmt::format("\"stored_bytes\":{},\"compressed_bytes\":{},", L.stored_bytes, L.compressed_bytes);
    s += "\"tensors\":{";
    for (size_t j = 0; j < L.tensors.size(); ++j) {
      const TrunkTensor& t = L.tensors[j];
      std::string shape;
      for (int d = 0; d < t.rank; ++d) shape += fmt::format("{}{}", d ? "," : "", t.shape[size_t(d)]);
      s += fmt::format("{}{}:{{\"off\":{},\"nbytes\":{},\"dtype\":\"{}\",\"shape\":[{}]}}", j ? "," : "",
                       json_quote(t.name), t.off, t.nbytes, dtype_name(t.dtype), shape);
    }
    s += "}}";
  }
  return s + "\n]}\n";
}

[[noreturn]] void sys_fail(const fs::path& p, const char* what) {
  throw runtime_error(fmt::format("pack-trunk: {}: {}: {}", p.string(), what, std::strerror(errno)));
}

void write_all(int fd, const fs::path& p, const std::byte* data, size_t n, uint64_t off) {
  while (n > 0) {
    ssize_t w = pwrite(fd, data, std::min(n, kMaxReadSyscall), off_t(off));
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) sys_fail(p, "write failed");
    data += w, n -= size_t(w), off += uint64_t(w);
  }
}

void fsync_dir(const fs::path& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

// Appends bytes to trunk.bin.partial through two 64 MiB staging buffers: one fills while the
// other is written by a helper thread, and written ranges are dropped from the page cache (a
// 109 GB pack must not evict everything else on an 8 GB machine).
class Staged {
 public:
  Staged(const fs::path& path, uint64_t total, const std::function<void(uint64_t, uint64_t)>& progress,
         bool (*cancelled)())
      : path_(path), total_(total), progress_(progress), cancelled_(cancelled) {
    fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd_ < 0) sys_fail(path, "cannot create");
    for (auto& b : bufs_) b = AlignedBuffer(kStageBytes);
    if (const auto after = env::u64(env::kFailAfterBytes)) {
      fail_after_ = *after;
      const auto mode = env::text(env::kFailMode);
      kill_ = mode == "kill";
      wait_ = mode == "wait";
    }
  }
  ~Staged() {
    if (pending_.valid()) pending_.wait();
    if (fd_ >= 0) ::close(fd_);
  }

  // Room to fill in place: at most `n` bytes at the current position.
  std::span<std::byte> room(size_t n) {
    check_cancelled();
    if (fill_ == kStageBytes) flush();
    return bufs_[cur_].bytes().subspan(fill_, std::min(n, kStageBytes - fill_));
  }
  void commit(size_t n) { fill_ += n; }

  void check_cancelled() const {
    if (cancelled_ && cancelled_()) throw runtime_error("pack-trunk: interrupted");
  }

  void finish() {
    flush();
    if (pending_.valid()) pending_.get();
    if (::fdatasync(fd_) != 0) sys_fail(path_, "fdatasync failed");
    if (::close(fd_) != 0) sys_fail(path_, "close failed");
    fd_ = -1;
  }

 private:
  void flush() {
    if (pending_.valid()) pending_.get();  // rethrows the helper's error
    if (fill_ == 0) return;
    const std::byte* data = bufs_[cur_].data();
    size_t n = fill_;
    uint64_t off = flushed_;
    pending_ = std::async(std::launch::async, [this, data, n, off] {
      write_all(fd_, path_, data, n, off);
      ::sync_file_range(fd_, off_t(off), off_t(n),
                        SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE | SYNC_FILE_RANGE_WAIT_AFTER);
      ::posix_fadvise(fd_, off_t(off), off_t(n), POSIX_FADV_DONTNEED);
    });
    flushed_ += n;
    fill_ = 0;
    cur_ ^= 1;
    if (progress_) progress_(flushed_, total_);
    if (fail_after_ && flushed_ >= *fail_after_) {
      pending_.get();
      if (kill_) std::raise(SIGKILL);
      if (wait_ && cancelled_)
        for (int i = 0; i < 6000 && !cancelled_(); ++i)
          std::this_thread::sleep_for(std::chrono::milliseconds(10));
      check_cancelled();
      throw runtime_error(
          fmt::format("pack-trunk: stopped after {} bytes by K3FLOW_FAIL_AFTER_BYTES (test hook)", flushed_));
    }
  }

  fs::path path_;
  uint64_t total_;
  const std::function<void(uint64_t, uint64_t)>& progress_;
  int fd_ = -1;
  AlignedBuffer bufs_[2];
  int cur_ = 0;
  size_t fill_ = 0;
  uint64_t flushed_ = 0;
  std::future<void> pending_;
  bool (*cancelled_)();
  std::optional<uint64_t> fail_after_;
  bool kill_ = false, wait_ = false;
};

// Removes the .partial files unless released (any exception path of a pack).
struct PartialGuard {
  std::vector<fs::path> paths;
  bool keep = false;
  ~PartialGuard() {
    if (keep) return;
    std::error_code ec;
    for (const auto& p : paths) fs::remove(p, ec);
    for (const auto& d : created_dirs) fs::remove(d, ec);  // only when empty; deepest first
  }
  std::vector<fs::path> created_dirs;
};

}  // namespace

PackStats pack_trunk(const ShardSet& shards, int n_layers, const fs::path& dir,
                     const std::function<void(uint64_t, uint64_t)>& progress, bool (*cancelled)(),
                     codec::Codec codec) {
  auto t0 = std::chrono::steady_clock::now();
  TrunkLayout lay = layout_trunk(shards, n_layers);
  const TrunkSource source = trunk_source(shards, lay.sources);
  std::error_code ec;
  const fs::path bin = dir / "trunk.bin", json = dir / "trunk.json";
  const fs::path bin_tmp = partial_path(bin), json_tmp = partial_path(json);
  PartialGuard guard{{bin_tmp, json_tmp}, false, {}};
  for (fs::path p = dir.lexically_normal(); !p.empty() && !fs::exists(p, ec); p = p.parent_path()) {
    guard.created_dirs.push_back(p);
    if (p == p.parent_path()) break;
  }
  fs::create_directories(dir, ec);
  if (ec) throw runtime_error(fmt::format("pack-trunk: cannot create {}: {}", dir.string(), ec.message()));

  PackStats st;
  const bool packed = codec != codec::Codec::none;
  const std::function<void(uint64_t, uint64_t)> no_progress;
  if (packed) {
    // Each layer's decoded image is assembled, hashed, encoded and written; progress counts the
    // decoded bytes done (the stored total is not known in advance).
    Staged out(bin_tmp, lay.file_bytes, no_progress, cancelled);
    uint64_t file_off = 0, raw_done = 0;
    for (size_t l = 0; l < lay.layers.size(); ++l) {
      TrunkLayer& L = lay.layers[l];
      out.check_cancelled();
      AlignedBuffer image(size_t(L.nbytes));
      std::memset(image.data(), 0, image.size());
      for (size_t i = 0; i < L.tensors.size(); ++i) {
        const TrunkTensor& t = L.tensors[i];
        shards.read_range(lay.sources[l][i].shard, lay.sources[l][i].offset,
                          image.bytes().subspan(size_t(t.off), size_t(t.nbytes)));
        st.payload_bytes += t.nbytes;
      }
      L.xxh64 = xxh64(image.bytes());
      const auto e0 = std::chrono::steady_clock::now();
      const std::vector<std::byte> enc = codec::encode(image.bytes(), {.codec = codec});
      st.encode_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - e0).count();
      L.file_off = file_off;
      L.compressed_bytes = enc.size();
      L.stored_bytes = align_up(std::max<uint64_t>(enc.size(), 1), kTrunkAlign);
      for (size_t done = 0; done < enc.size();) {
        auto r = out.room(enc.size() - done);
        std::memcpy(r.data(), enc.data() + done, r.size());
        out.commit(r.size());
        done += r.size();
      }
      for (uint64_t n = L.stored_bytes - enc.size(); n > 0;) {
        auto r = out.room(size_t(n));
        std::memset(r.data(), 0, r.size());
        out.commit(r.size());
        n -= r.size();
      }
      file_off += L.stored_bytes;
      st.largest_layer = std::max(st.largest_layer, L.nbytes);
      st.raw_bytes += L.nbytes;
      if (progress) progress(raw_done += L.nbytes, lay.file_bytes);
    }
    out.finish();
    out.check_cancelled();
    lay.file_bytes = file_off;
  } else {
    Staged out(bin_tmp, lay.file_bytes, progress, cancelled);
    for (size_t l = 0; l < lay.layers.size(); ++l) {
      TrunkLayer& L = lay.layers[l];
      Xxh64 h;
      uint64_t layer_pos = 0;  // bytes of this layer emitted so far
      auto emit_zeros = [&](uint64_t n) {
        while (n > 0) {
          auto r = out.room(n);
          std::memset(r.data(), 0, r.size());
          h.update(r);
          out.commit(r.size());
          n -= r.size();
          layer_pos += r.size();
        }
      };
      for (size_t i = 0; i < L.tensors.size(); ++i) {
        const TrunkTensor& t = L.tensors[i];
        const TensorInfo& src = lay.sources[l][i];
        emit_zeros(t.off - layer_pos);
        for (uint64_t done = 0; done < t.nbytes;) {
          auto r = out.room(t.nbytes - done);
          shards.read_range(src.shard, src.offset + done, r);
          h.update(r);
          out.commit(r.size());
          done += r.size();
          layer_pos += r.size();
        }
        st.payload_bytes += t.nbytes;
      }
      emit_zeros(L.nbytes - layer_pos);
      L.xxh64 = h.digest();
      st.largest_layer = std::max(st.largest_layer, L.nbytes);
    }
    out.finish();
    out.check_cancelled();
    st.raw_bytes = lay.file_bytes;
  }
  st.bytes_written = lay.file_bytes;

  std::string text = trunk_json(lay.layers, source, codec);
  int fd = ::open(json_tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) sys_fail(json_tmp, "cannot create");
  try {
    write_all(fd, json_tmp, reinterpret_cast<const std::byte*>(text.data()), text.size(), 0);
    if (::fsync(fd) != 0) sys_fail(json_tmp, "fsync failed");
  } catch (...) {
    ::close(fd);
    throw;
  }
  ::close(fd);
  if (cancelled && cancelled()) throw runtime_error("pack-trunk: interrupted");
  // trunk.json goes last: until it appears, no reader accepts the directory. An older trunk.json
  // is removed first so it never describes the new trunk.bin.
  fs::remove(json, ec);
  if (::rename(bin_tmp.c_str(), bin.c_str()) != 0) sys_fail(bin, "rename failed");
  if (::rename(json_tmp.c_str(), json.c_str()) != 0) sys_fail(json, "rename failed");
  guard.keep = true;
  fsync_dir(dir);
  st.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return st;
}

// ---------------------------------------------------------------- reader

namespace {

std::optional<DType> parse_dtype(std::string_view s) {
  for (DType d : {DType::U8, DType::BF16, DType::F16, DType::F32})
    if (s == dtype_name(d)) return d;
  return std::nullopt;
}

// What the checks of one trunk.json share: its path (every error is one line naming it) and the
// trunk.bin it describes.
struct TrunkJson {
  const fs::path& path;
  const fs::path& bin;
  uint64_t bin_size;

  Error bad(const std::string& what) const {
    return runtime_error(fmt::format("trunk: {}: {}", path.string(), what));
  }
  // `e[key]` as an unsigned integer; `where` names `e` in the error.
  uint64_t u64(simdjson::dom::element e, const char* key, const std::string& where) const {
    uint64_t v;
    if (e[key].get_uint64().get(v))
      throw bad(fmt::format("{}: \"{}\" missing or not an unsigned integer", where, key));
    return v;
  }
};

// trunk.json's text, after making sure the directory has one.
simdjson::padded_string read_trunk_json(const fs::path& json, const fs::path& dir) {
  if (!fs::exists(json))
    throw runtime_error(
        fmt::format("trunk: {}: missing (is {} a packed trunk?)", json.string(), dir.string()));
  File jf = File::open_read(json, File::Mode::buffered);
  simdjson::padded_string text(jf.size());
  jf.read_exact(0, std::as_writable_bytes(std::span(text.data(), jf.size())));
  return text;
}

// The top-level "align" (must be 4096) and "codec" (absent: none).
codec::Codec read_align_and_codec(const TrunkJson& j, simdjson::dom::element doc) {
  if (uint64_t a = j.u64(doc, "align", "top level"); a != kTrunkAlign)
    throw j.bad(fmt::format("align is {}, this engine reads only {}-aligned trunks", a, kTrunkAlign));
  std::string_view cs;
  if (doc["codec"].get_string().get(cs)) return codec::Codec::none;
  const auto c = codec::parse_codec(cs);
  if (!c) throw j.bad(fmt::format("unknown codec \"{}\" (this build reads none, exp4, exp3, huff)", cs));
  return *c;
}

// The "layers" array, holding `expected_layers` entries when that is >= 0.
simdjson::dom::array layer_array(const TrunkJson& j, simdjson::dom::element doc, int expected_layers) {
  simdjson::dom::array layers;
  if (doc["layers"].get_array().get(layers)) throw j.bad("\"layers\" missing or not an array");
  if (expected_layers >= 0 && layers.size() != size_t(expected_layers))
    throw j.bad(fmt::format("holds {} layers, the config has {}", layers.size(), expected_layers));
  return layers;
}

// Layer L's place in trunk.bin: file_off and nbytes (positive 4096-multiples) and, when `packed`,
// stored_bytes and compressed_bytes (a codec stream's room and length); its stored bytes lie
// inside the file.
void read_layer_extent(const TrunkJson& j, simdjson::dom::element le, const std::string& where, bool packed,
                       TrunkLayer& L) {
  L.file_off = j.u64(le, "file_off", where);
  L.nbytes = j.u64(le, "nbytes", where);
  if (L.file_off % kTrunkAlign || L.nbytes % kTrunkAlign || L.nbytes == 0)
    throw j.bad(
        fmt::format("{}: file_off {} / nbytes {} not positive 4096-multiples", where, L.file_off, L.nbytes));
  L.stored_bytes = L.compressed_bytes = L.nbytes;
  if (packed) {
    L.stored_bytes = j.u64(le, "stored_bytes", where);
    L.compressed_bytes = j.u64(le, "compressed_bytes", where);
    if (L.stored_bytes % kTrunkAlign || L.stored_bytes == 0 || L.compressed_bytes > L.stored_bytes ||
        L.compressed_bytes < codec::kHeaderBytes || L.nbytes / 2 > L.compressed_bytes)
      throw j.bad(
          fmt::format("{}: stored_bytes {} / compressed_bytes {}: not a positive 4096-multiple holding "
                      "a codec stream (which decodes to less than twice its size)",
                      where, L.stored_bytes, L.compressed_bytes));
  }
  if (L.file_off > j.bin_size || L.stored_bytes > j.bin_size - L.file_off)  // no wrap-around
    throw j.bad(fmt::format("{}: file_off {} + {} {} runs past the end of {} ({} bytes)", where, L.file_off,
                            packed ? "stored_bytes" : "nbytes", L.stored_bytes, j.bin.string(), j.bin_size));
}

// A layer's optional "xxh64": 16 hex digits when present.
void read_layer_xxh64(const TrunkJson& j, simdjson::dom::element le, const std::string& where,
                      TrunkLayer& L) {
  std::string_view hex;
  if (le["xxh64"].get_string().get(hex)) return;
  auto [p, ec] = std::from_chars(hex.data(), hex.data() + hex.size(), L.xxh64, 16);
  if (ec != std::errc() || p != hex.data() + hex.size() || hex.size() != 16)
    throw j.bad(fmt::format("{}: xxh64 \"{}\" is not 16 hex digits", where, hex));
  L.has_xxh64 = true;
}

// A tensor's optional "shape": at most 4 unsigned entries whose product times the dtype's size
// (no overflow) is the tensor's nbytes.
void read_tensor_shape(const TrunkJson& j, simdjson::dom::element te, const std::string& tw,
                       TrunkTensor& tt) {
  simdjson::dom::array shape;
  if (te["shape"].get_array().get(shape)) return;
  if (shape.size() > 4) throw j.bad(fmt::format("{}: rank {} > 4", tw, shape.size()));
  uint64_t numel = 1;
  for (simdjson::dom::element s : shape) {
    uint64_t v;
    if (s.get_uint64().get(v)) throw j.bad(fmt::format("{}: shape entries must be unsigned integers", tw));
    tt.shape[tt.rank++] = v;
    if (__builtin_mul_overflow(numel, v, &numel)) throw j.bad(fmt::format("{}: shape overflows 64 bits", tw));
  }
  uint64_t want = 0;
  if (__builtin_mul_overflow(numel, uint64_t(dtype_size(tt.dtype)), &want) || want != tt.nbytes)
    throw j.bad(fmt::format("{}: nbytes {} != numel {} x {}", tw, tt.nbytes, numel, dtype_size(tt.dtype)));
}

// One entry of a layer's "tensors" (the layer `where`, `layer_bytes` long): its bytes inside the layer.
TrunkTensor read_tensor(const TrunkJson& j, std::string_view key, simdjson::dom::element te,
                        const std::string& where, uint64_t layer_bytes) {
  TrunkTensor tt;
  tt.name = std::string(key);
  const std::string tw = fmt::format("{}: tensor {}", where, tt.name);
  tt.off = j.u64(te, "off", tw);
  tt.nbytes = j.u64(te, "nbytes", tw);
  std::string_view ds;
  if (te["dtype"].get_string().get(ds)) throw j.bad(fmt::format("{}: dtype missing", tw));
  auto d = parse_dtype(ds);
  if (!d) throw j.bad(fmt::format("{}: unknown dtype {}", tw, ds));
  tt.dtype = *d;
  read_tensor_shape(j, te, tw, tt);
  if (tt.off > layer_bytes || tt.nbytes > layer_bytes - tt.off)
    throw j.bad(fmt::format("{}: bytes [{}, {}) outside its layer ({} bytes)", tw, tt.off, tt.off + tt.nbytes,
                            layer_bytes));
  return tt;
}

// Entry `l` of "layers": its index (when given), extent, checksum and at least one tensor.
TrunkLayer read_layer(const TrunkJson& j, simdjson::dom::element le, int l, bool packed) {
  TrunkLayer L;
  L.layer = l;
  const std::string where = fmt::format("layer {}", L.layer);
  uint64_t idx;
  if (!le["layer"].get_uint64().get(idx) && idx != uint64_t(L.layer))
    throw j.bad(fmt::format("{} is listed as layer {}", where, idx));
  read_layer_extent(j, le, where, packed, L);
  read_layer_xxh64(j, le, where, L);
  simdjson::dom::object tensors;
  if (le["tensors"].get_object().get(tensors)) throw j.bad(fmt::format("{}: \"tensors\" missing", where));
  for (auto [key, te] : tensors) L.tensors.push_back(read_tensor(j, key, te, where, L.nbytes));
  if (L.tensors.empty()) throw j.bad(fmt::format("{}: no tensors", where));
  return L;
}

// 16 hex digits in "source". Takes a lookup's result as it is (or an element): converting a
// missing key's result to an element throws simdjson's own exception, which names neither the
// file nor the field.
template <class Lookup>
uint64_t source_hex64(const TrunkJson& j, Lookup e, const std::string& what) {
  std::string_view hex;
  uint64_t v = 0;
  if (e.get_string().get(hex)) throw j.bad(fmt::format("source: {} is missing or not a string", what));
  auto [p, ec] = std::from_chars(hex.data(), hex.data() + hex.size(), v, 16);
  if (ec != std::errc() || p != hex.data() + hex.size() || hex.size() != 16)
    throw j.bad(fmt::format("source: {} \"{}\" is not 16 hex digits", what, hex));
  return v;
}

// The "source" object, when there is one: the sample size this engine uses, every shard, and one
// layer sample per layer (`n_layers`).
std::optional<TrunkSource> read_source(const TrunkJson& j, simdjson::dom::element doc, size_t n_layers) {
  simdjson::dom::element src;
  if (doc["source"].get(src) || !src.is_object()) return std::nullopt;
  if (uint64_t sb = j.u64(src, "sample_bytes", "source"); sb != kTrunkSampleBytes)
    throw j.bad(fmt::format("source: sample_bytes {} (this engine samples {})", sb, kTrunkSampleBytes));
  simdjson::dom::array shards, samples;
  if (src["shards"].get_array().get(shards) || src["layer_samples"].get_array().get(samples))
    throw j.bad("source: \"shards\" or \"layer_samples\" missing");
  TrunkSource out;
  for (simdjson::dom::element se : shards) {
    TrunkSourceShard sh;
    std::string_view file;
    if (se["file"].get_string().get(file)) throw j.bad("source: a shard without \"file\"");
    sh.file = std::string(file);
    sh.bytes = j.u64(se, "bytes", "source shard " + sh.file);
    sh.header_xxh64 = source_hex64(j, se["header_xxh64"], "shard " + sh.file + " header_xxh64");
    out.shards.push_back(std::move(sh));
  }
  for (simdjson::dom::element e : samples) out.layer_samples.push_back(source_hex64(j, e, "layer_samples"));
  if (out.layer_samples.size() != n_layers)
    throw j.bad(fmt::format("source: {} layer_samples for {} layers", out.layer_samples.size(), n_layers));
  return out;
}

// No two layers share a byte of trunk.bin (each is already inside the file).
void check_no_overlap(const TrunkJson& j, const std::vector<TrunkLayer>& layers) {
  std::vector<const TrunkLayer*> by_off;
  by_off.reserve(layers.size());
  for (const TrunkLayer& L : layers) by_off.push_back(&L);
  std::sort(by_off.begin(), by_off.end(), [](auto* a, auto* b) { return a->file_off < b->file_off; });
  for (size_t i = 1; i < by_off.size(); ++i)  // both ends are <= the file's size: no wrap-around
    if (by_off[i - 1]->file_off + by_off[i - 1]->stored_bytes > by_off[i]->file_off)
      throw j.bad(fmt::format("layers {} and {} overlap in {}", by_off[i - 1]->layer, by_off[i]->layer,
                              j.bin.string()));
}

}  // namespace

PackedTrunk PackedTrunk::open(const fs::path& dir, int expected_layers, File::Mode mode) {
  const fs::path json = dir / "trunk.json", bin = dir / "trunk.bin";
  simdjson::padded_string text = read_trunk_json(json, dir);

  PackedTrunk t(File::open_read(bin, mode));
  t.json_path_ = json;
  const TrunkJson j{json, bin, t.file_.size()};

  simdjson::dom::parser parser;
  simdjson::dom::element doc;
  if (auto err = parser.parse(text).get(doc))
    throw j.bad(fmt::format("not valid JSON ({})", simdjson::error_message(err)));
  t.codec_ = read_align_and_codec(j, doc);
  const bool packed = t.codec_ != codec::Codec::none;
  for (simdjson::dom::element le : layer_array(j, doc, expected_layers))
    t.layers_.push_back(read_layer(j, le, int(t.layers_.size()), packed));
  if (std::optional<TrunkSource> src = read_source(j, doc, t.layers_.size())) {
    t.source_ = std::move(*src);
    t.has_source_ = true;
  }
  check_no_overlap(j, t.layers_);
  t.loaded_ok_ = std::make_unique<std::atomic<bool>[]>(t.layers_.size());
  for (size_t i = 0; i < t.layers_.size(); ++i) t.loaded_ok_[i].store(false);
  return t;
}

uint64_t PackedTrunk::stored_bytes() const {
  uint64_t n = 0;
  for (const TrunkLayer& L : layers_) n += L.stored_bytes;
  return n;
}

uint64_t PackedTrunk::raw_bytes() const {
  uint64_t n = 0;
  for (const TrunkLayer& L : layers_) n += L.nbytes;
  return n;
}

codec::Stream PackedTrunk::layer_stream(int l, std::span<const std::byte> stored) const {
  const TrunkLayer& L = layer(l);
  if (stored.size() < L.compressed_bytes)
    throw runtime_error(fmt::format("trunk: {}: layer {}: decode given {} stored bytes, needs {}",
                                    file_.path().string(), l, stored.size(), L.compressed_bytes));
  auto s = codec::Stream::parse(stored.first(size_t(L.compressed_bytes)),
                                fmt::format("{} layer {}", file_.path().string(), l), L.file_off);
  if (s.raw_bytes() != L.nbytes)
    throw runtime_error(fmt::format("trunk: {}: layer {}: its stream decodes to {} bytes, trunk.json says {}",
                                    file_.path().string(), l, s.raw_bytes(), L.nbytes));
  return s;
}

void PackedTrunk::decode_layer(int l, std::span<const std::byte> stored, std::span<std::byte> out) const {
  const TrunkLayer& L = layer(l);
  if (out.size() < L.nbytes)
    throw runtime_error(fmt::format("trunk: {}: layer {}: decode given {} output bytes, needs {}",
                                    file_.path().string(), l, out.size(), L.nbytes));
  const auto s = layer_stream(l, stored);
  const auto dst = out.first(size_t(L.nbytes));
  // Chunks of 16 blocks: enough work per task, and a layer spreads over every worker.
  tbb::parallel_for(
      tbb::blocked_range<uint32_t>(0, s.n_blocks(), 16),
      [&](const tbb::blocked_range<uint32_t>& r) { s.decode_blocks(r.begin(), r.end(), dst, true); });
  if (uint64_t got = xxh64(dst); !L.has_xxh64 || got != L.xxh64)
    throw runtime_error(fmt::format(
        "trunk: {}: layer {} decoded checksum mismatch (xxh64 {:016x}, trunk.json says {})",
        file_.path().string(), l, got, L.has_xxh64 ? fmt::format("{:016x}", L.xxh64) : std::string("none")));
}

uint64_t PackedTrunk::largest_layer() const {
  uint64_t m = 0;
  for (const TrunkLayer& L : layers_) m = std::max(m, L.nbytes);
  return m;
}

size_t PackedTrunk::index_bytes() const {
  size_t n = layers_.capacity() * sizeof(TrunkLayer);
  for (const TrunkLayer& L : layers_) {
    n += L.tensors.capacity() * sizeof(TrunkTensor);
    for (const TrunkTensor& t : L.tensors)
      if (t.name.size() >= sizeof(std::string)) n += t.name.capacity() + 1;
  }
  return n;
}

void PackedTrunk::verify_layer(int l) const {
  const TrunkLayer& L = layer(l);
  if (!L.has_xxh64)
    throw runtime_error(
        fmt::format("trunk: {}: layer {} has no xxh64 checksum to verify", json_path_.string(), l));
  if (codec_ != codec::Codec::none) {
    AlignedBuffer stored(size_t(L.stored_bytes)), out(size_t(L.nbytes));
    try {
      file_.read_exact(L.file_off, stored.bytes());
    } catch (const Error& e) {
      throw runtime_error(
          fmt::format("trunk: layer {} of {} unreadable: {}", l, file_.path().string(), e.what()));
    }
    decode_layer(l, stored.bytes(), out.bytes());
    return;
  }
  AlignedBuffer buf(std::min<uint64_t>(L.nbytes, kStageBytes));
  Xxh64 h;
  try {
    for (uint64_t done = 0; done < L.nbytes;) {
      size_t n = size_t(std::min<uint64_t>(buf.size(), L.nbytes - done));
      auto chunk = buf.bytes().first(n);
      file_.read_exact(L.file_off + done, chunk);
      h.update(chunk);
      done += n;
    }
  } catch (const Error& e) {
    throw runtime_error(
        fmt::format("trunk: layer {} of {} unreadable: {}", l, file_.path().string(), e.what()));
  }
  if (uint64_t got = h.digest(); got != L.xxh64)
    throw runtime_error(
        fmt::format("trunk: {}: layer {} checksum mismatch (xxh64 {:016x}, trunk.json says {:016x})",
                    file_.path().string(), l, got, L.xxh64));
}

void PackedTrunk::check_source(const ShardSet& shards) const {
  const std::string dir = json_path_.parent_path().string();
  auto stale = [&](const std::string& what) {
    return runtime_error(fmt::format(
        "trunk: {} was packed from another checkpoint ({}); re-run `k3flow pack-trunk MODEL_DIR {}`", dir,
        what, dir));
  };
  if (!has_source_)
    throw runtime_error(fmt::format(
        "trunk: {} records no source checkpoint (packed by an older k3flow); re-run `k3flow pack-trunk "
        "MODEL_DIR {}`",
        json_path_.string(), dir));
  const TrunkSource& was = source_;
  if (was.shards.size() != shards.shard_count())
    throw stale(fmt::format("{} shards then, {} now", was.shards.size(), shards.shard_count()));
  // Resolve each trunk tensor in the shards (a missing one is a different checkpoint).
  std::vector<std::vector<TensorInfo>> sources(layers_.size());
  for (size_t l = 0; l < layers_.size(); ++l)
    for (const TrunkTensor& t : layers_[l].tensors) {
      std::optional<TensorInfo> info = shards.find(t.name);
      if (!info) throw stale(fmt::format("tensor {} is not in it", t.name));
      sources[l].push_back(*info);
    }
  const TrunkSource now = trunk_source(shards, sources);
  for (size_t s = 0; s < now.shards.size(); ++s) {
    const TrunkSourceShard &a = was.shards[s], &b = now.shards[s];
    if (a.file != b.file) throw stale(fmt::format("shard {} was {}, is {}", s, a.file, b.file));
    if (a.bytes != b.bytes) throw stale(fmt::format("{} was {} bytes, is {}", a.file, a.bytes, b.bytes));
    if (a.header_xxh64 != b.header_xxh64) throw stale(fmt::format("{}: safetensors header differs", a.file));
  }
  for (size_t l = 0; l < layers_.size(); ++l)
    if (now.layer_samples[l] != was.layer_samples[l])
      throw stale(fmt::format("layer {}: tensor bytes differ (first {} bytes of each tensor sampled)", l,
                              kTrunkSampleBytes));
}

void PackedTrunk::check_loaded(int l, std::span<const std::byte> bytes) const {
  const TrunkLayer& L = layer(l);
  if (loaded_ok_[size_t(l)].load(std::memory_order_acquire)) return;  // hashed once a layer
  if (bytes.size() < L.nbytes)
    throw runtime_error(fmt::format("trunk: {}: layer {}: {} bytes read, {} expected", file_.path().string(),
                                    l, bytes.size(), L.nbytes));
  check_loaded_digest(l, xxh64(bytes.first(size_t(L.nbytes))));
}

void PackedTrunk::check_loaded_digest(int l, uint64_t got) const {
  const TrunkLayer& L = layer(l);
  std::atomic<bool>& ok = loaded_ok_[size_t(l)];
  if (ok.load(std::memory_order_acquire)) return;
  if (!L.has_xxh64)
    throw runtime_error(
        fmt::format("trunk: {}: layer {} has no xxh64 checksum; re-run pack-trunk", json_path_.string(), l));
  if (got != L.xxh64)
    throw runtime_error(fmt::format(
        "trunk: {}: layer {} checksum mismatch when read (xxh64 {:016x}, trunk.json says {:016x}); re-run "
        "pack-trunk",
        file_.path().string(), l, got, L.xxh64));
  ok.store(true, std::memory_order_release);
}

}  // namespace k3::io
