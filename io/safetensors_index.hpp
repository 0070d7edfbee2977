// The compact name -> tensor index behind ShardSet (docs/engine.md §1.6: the references spend ~130 and
// 216 bytes per tensor; this one spends ~30 at the real 497,220 tensors).
//
// Names are stored sorted and front-coded in one byte blob: each record is
//   varint shared-prefix length | varint suffix length | suffix bytes |
//   byte dtype + 4*rank | varint shard | varint absolute offset | rank x varint dim
// The shared prefix is the longest one the name has in common with the previous name (lookup relies
// on it), and every 16th record is a restart (shared length 0, the full name) whose blob offset is
// kept in a u32 table. Lookup binary-searches the restarts, then scans at most 15 records. nbytes is not
// stored: it is numel x dtype size, which the header parser has checked against data_offsets.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "io/safetensors.hpp"

namespace k3::io {

class TensorIndex {
 public:
  static constexpr size_t kRestartInterval = 16;

  // Takes names in strictly ascending byte order (the caller sorts and rejects duplicates).
  class Builder {
   public:
    void reserve(size_t tensors, size_t name_bytes);
    void add(std::string_view name, const TensorInfo& info);
    TensorIndex finish();  // shrinks every container to its size

   private:
    std::vector<uint8_t> blob_;
    std::vector<uint32_t> restarts_;
    std::string prev_;
    size_t count_ = 0;
  };

  std::optional<TensorInfo> find(std::string_view name) const;
  size_t size() const { return count_; }
  // Calls fn for every tensor in ascending name order.
  void for_each(const std::function<void(std::string_view name, const TensorInfo&)>& fn) const;
  size_t heap_bytes() const { return blob_.capacity() + restarts_.capacity() * sizeof(uint32_t); }

 private:
  std::vector<uint8_t> blob_;
  std::vector<uint32_t> restarts_;
  size_t count_ = 0;
};

}  // namespace k3::io
