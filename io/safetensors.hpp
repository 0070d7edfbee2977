// A set of safetensors shards indexed by tensor name (docs/model.md §2, docs/engine.md §1.2). Opening reads
// only the headers. The in-memory index is compact (target <= 100 bytes per tensor at 497,220
// tensors) and measured by index_bytes().
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>

namespace k3::io {

class File;

enum class DType : uint8_t { U8, BF16, F16, F32 };
const char* dtype_name(DType);
size_t dtype_size(DType);

struct TensorInfo {
  DType dtype;
  uint8_t rank;                   // 0..4
  std::array<uint64_t, 4> shape;  // unused dims are 1
  uint32_t shard;                 // index into the shard list
  uint64_t offset;                // absolute byte offset in the shard file
  uint64_t nbytes;
  uint64_t numel() const;
};

class ShardSet {
 public:
  // Reads model.safetensors.index.json if present (its shard list), else every *.safetensors in
  // sorted order. Throws Error naming the shard and tensor on any malformed header.
  static ShardSet open(const std::filesystem::path& dir);
  ShardSet(ShardSet&&) noexcept;
  ShardSet& operator=(ShardSet&&) noexcept;
  ~ShardSet();

  std::optional<TensorInfo> find(std::string_view name) const;
  size_t tensor_count() const;
  size_t shard_count() const;
  const std::filesystem::path& shard_path(uint32_t shard) const;
  uint64_t shard_size(uint32_t shard) const;
  // The open shard (buffered + O_DIRECT descriptors), for readers that batch their own I/O.
  const File& shard_file(uint32_t shard) const;
  void for_each(const std::function<void(std::string_view name, const TensorInfo&)>& fn) const;
  size_t index_bytes() const;  // heap bytes held by the index (names + entries + lookup table)

  // Positioned read of a whole tensor (or any byte range of a shard) into caller memory.
  void read(const TensorInfo& t, std::span<std::byte> dst) const;
  void read_range(uint32_t shard, uint64_t offset, std::span<std::byte> dst) const;

 private:
  ShardSet();
  struct Impl;
  Impl* impl_;
};

}  // namespace k3::io
