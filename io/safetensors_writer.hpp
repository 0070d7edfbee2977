// Writes one safetensors shard (docs/engine.md §1.2): [u64 LE header length][JSON header][data].
// The header is laid out before any byte is written (tensors back to back in the order given),
// compact JSON like the released files, space-padded so the data starts 8-byte aligned.
// Bytes go to `<name>.partial`; only commit() renames it to its final name, so an interrupted or
// failed write never leaves a file that looks like a finished shard. Data is written with O_DIRECT
// where the filesystem allows (buffered, with streamed writeback, elsewhere).
#pragma once
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "io/aligned.hpp"
#include "io/json_text.hpp"
#include "io/safetensors.hpp"

namespace k3::io {

struct TensorEntry {
  std::string name;
  DType dtype;
  std::vector<uint64_t> shape;  // rank 0..4
  uint64_t numel() const;
  uint64_t nbytes() const { return numel() * dtype_size(dtype); }
};

using Metadata = std::vector<std::pair<std::string, std::string>>;

struct ShardLayout {
  std::string header;             // JSON, padded with spaces to a multiple of 8
  std::vector<uint64_t> offsets;  // per tensor, relative to the data start
  uint64_t data_bytes = 0;
  uint64_t data_start() const { return 8 + header.size(); }
  uint64_t file_size() const { return data_start() + data_bytes; }
};

// Lays tensors out back to back. Throws usage Error on an empty or duplicate name, or rank > 4.
ShardLayout layout_shard(std::span<const TensorEntry> tensors, const Metadata& metadata);

// Data order inside a shard as safetensors' own writer (and so the released files) lays it out:
// F32, then F16, then BF16, then U8, each group by name.
int data_order_rank(DType d);

// The name a shard is written under until commit().
std::filesystem::path partial_path(const std::filesystem::path& final_path);

class SafetensorsWriter {
 public:
  enum class Mode { direct_preferred, buffered };

  // Creates `partial_path(path)` (refusing to overwrite one) and writes the length and header.
  // Throws runtime Error naming the file on any failure.
  SafetensorsWriter(std::filesystem::path path, std::vector<TensorEntry> tensors,
                    const Metadata& metadata = {{"format", "pt"}}, Mode mode = Mode::direct_preferred);
  SafetensorsWriter(SafetensorsWriter&&) noexcept;
  SafetensorsWriter& operator=(SafetensorsWriter&&) noexcept;
  SafetensorsWriter(const SafetensorsWriter&) = delete;
  SafetensorsWriter& operator=(const SafetensorsWriter&) = delete;
  ~SafetensorsWriter();  // removes the partial file unless committed

  const std::filesystem::path& path() const { return path_; }
  const std::vector<TensorEntry>& tensors() const { return tensors_; }
  const ShardLayout& layout() const { return layout_; }
  uint64_t data_written() const { return written_; }
  bool direct() const { return direct_; }

  // Appends tensor bytes in declared order; may cross tensor boundaries. Refuses to write past
  // the declared data size.
  void append(std::span<const std::byte> bytes);

  // Ends the data: every declared byte must have been appended. Starts writeback and closes.
  void finish();
  // Ends a header-only file: extends it to its full logical size without writing the data, so the
  // data region reads as zeros and occupies no blocks (a sparse replica). No bytes may have been
  // appended.
  void finish_sparse();
  // Flushes the finished file to disk, drops it from the page cache (a fresh checkpoint should
  // read cold) and renames it to its final name. Until then the destructor deletes it.
  void commit();

 private:
  static constexpr size_t kStage = size_t{8} << 20;
  void swap(SafetensorsWriter& o) noexcept;
  void close_fd();
  void discard() noexcept;  // closes and removes the partial file unless committed
  void put(std::span<const std::byte> bytes);
  void write_all(const std::byte* p, size_t n);
  void flush_stage_and_truncate(uint64_t size);
  void stream_out();
  void end(uint64_t expected_written);

  std::filesystem::path path_;
  std::vector<TensorEntry> tensors_;
  ShardLayout layout_;
  uint64_t written_ = 0;  // data bytes appended
  int fd_ = -1;
  bool direct_ = false;  // O_DIRECT in effect: 4096-aligned writes, small pieces staged
  AlignedBuffer stage_;  // direct mode: bytes not yet written
  size_t staged_ = 0;
  uint64_t started_ = 0, settled_ = 0;  // buffered mode: offsets handed to / completed by writeback
  bool finished_ = false;
  bool committed_ = true;  // nothing to remove until a partial file exists
};

}  // namespace k3::io
