#include "io/safetensors_index.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "io/error.hpp"

namespace k3::io {

namespace {

void put_varint(std::vector<uint8_t>& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<uint8_t>(v | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<uint8_t>(v));
}

// Reads records the builder wrote; the blob never comes from outside, so no bounds checks.
struct Cursor {
  const uint8_t* p;

  uint64_t varint() {
    uint64_t v = 0;
    for (int shift = 0;; shift += 7) {
      const uint8_t b = *p++;
      v |= uint64_t{b & 0x7Fu} << shift;
      if (b < 0x80) return v;
    }
  }
  // The name part of a record: shared prefix length and the suffix.
  std::string_view name_part(size_t& shared) {
    shared = varint();
    const size_t len = varint();
    std::string_view suffix(reinterpret_cast<const char*>(p), len);
    p += len;
    return suffix;
  }
  TensorInfo info() {
    TensorInfo t{};
    const uint8_t tag = *p++;
    t.dtype = static_cast<DType>(tag & 3);
    t.rank = static_cast<uint8_t>(tag >> 2);
    t.shard = static_cast<uint32_t>(varint());
    t.offset = varint();
    t.shape = {1, 1, 1, 1};
    for (unsigned i = 0; i < t.rank; ++i) t.shape[i] = varint();
    t.nbytes = t.numel() * dtype_size(t.dtype);
    return t;
  }
  void skip_info() {
    const uint8_t rank = *p++ >> 2;
    varint();
    varint();
    for (unsigned i = 0; i < rank; ++i) varint();
  }
};

}  // namespace

void TensorIndex::Builder::reserve(size_t tensors, size_t name_bytes) {
  // Front coding keeps roughly a quarter of the name bytes; entries take ~12 bytes.
  blob_.reserve(name_bytes / 3 + tensors * 14);
  restarts_.reserve(tensors / kRestartInterval + 1);
}

void TensorIndex::Builder::add(std::string_view name, const TensorInfo& info) {
  if (count_ > 0 && !(prev_ < name)) {
    throw runtime_error(fmt::format("TensorIndex: names out of order or repeated at '{}'", name));
  }
  size_t shared = 0;
  if (count_ % kRestartInterval == 0) {
    if (blob_.size() > UINT32_MAX) throw runtime_error("TensorIndex: index exceeds 4 GiB");
    restarts_.push_back(static_cast<uint32_t>(blob_.size()));
  } else {
    const size_t n = std::min(prev_.size(), name.size());
    while (shared < n && prev_[shared] == name[shared]) ++shared;
  }
  put_varint(blob_, shared);
  put_varint(blob_, name.size() - shared);
  blob_.insert(blob_.end(), name.begin() + static_cast<ptrdiff_t>(shared), name.end());
  blob_.push_back(static_cast<uint8_t>(static_cast<unsigned>(info.dtype) | (unsigned{info.rank} << 2)));
  put_varint(blob_, info.shard);
  put_varint(blob_, info.offset);
  for (unsigned i = 0; i < info.rank; ++i) put_varint(blob_, info.shape[i]);
  prev_.assign(name);
  ++count_;
}

TensorIndex TensorIndex::Builder::finish() {
  TensorIndex idx;
  blob_.shrink_to_fit();
  restarts_.shrink_to_fit();
  idx.blob_ = std::move(blob_);
  idx.restarts_ = std::move(restarts_);
  idx.count_ = count_;
  *this = Builder();
  return idx;
}

std::optional<TensorInfo> TensorIndex::find(std::string_view name) const {
  if (count_ == 0) return std::nullopt;
  auto restart_name = [&](size_t r) {
    Cursor c{blob_.data() + restarts_[r]};
    size_t shared;
    return c.name_part(shared);
  };
  // Last restart whose (full) name is <= name.
  size_t lo = 0, hi = restarts_.size();
  while (hi - lo > 1) {
    const size_t mid = lo + (hi - lo) / 2;
    if (restart_name(mid) <= name) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  if (restart_name(lo) > name) return std::nullopt;

  // The block's records are compared with `name` as they are decoded, without rebuilding them:
  // `match` is how many leading bytes the current record shares with `name`, and the current record
  // sorts below `name` (else the scan has returned). A record keeping fewer bytes of its predecessor
  // than `match` differs from `name` first where it grows past its predecessor, upward: it sorts
  // above `name`. One keeping more shares exactly `match` bytes, still below. One keeping exactly
  // `match` continues the comparison with its suffix. No allocation: find runs once per tensor a
  // plan locates (~10^6 at full scale).
  Cursor c{blob_.data() + restarts_[lo]};
  const size_t first = lo * kRestartInterval;
  const size_t last = std::min(count_, first + kRestartInterval);
  size_t match = 0;
  for (size_t i = first; i < last; ++i) {
    size_t shared;
    const std::string_view suffix = c.name_part(shared);
    if (shared < match) return std::nullopt;
    if (shared == match) {
      const std::string_view rest = name.substr(match);
      const size_t n = std::min(rest.size(), suffix.size());
      const size_t same = static_cast<size_t>(
          std::mismatch(rest.begin(), rest.begin() + n, suffix.begin()).first - rest.begin());
      if (same == suffix.size() && same == rest.size()) return c.info();
      // Past the common bytes: the record is above `name` if its byte is larger, or if `name` ends.
      if (same == rest.size() || (same < suffix.size() && static_cast<unsigned char>(suffix[same]) >
                                                              static_cast<unsigned char>(rest[same]))) {
        return std::nullopt;
      }
      match += same;
    }
    c.skip_info();
  }
  return std::nullopt;
}

void TensorIndex::for_each(const std::function<void(std::string_view, const TensorInfo&)>& fn) const {
  Cursor c{blob_.data()};
  std::string cur;
  for (size_t i = 0; i < count_; ++i) {
    size_t shared;
    const std::string_view suffix = c.name_part(shared);
    cur.resize(shared);
    cur.append(suffix);
    const TensorInfo t = c.info();
    fn(cur, t);
  }
}

}  // namespace k3::io
