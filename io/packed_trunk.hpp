// The packed trunk (docs/engine.md §2): every layer's dense (non-routed-expert) tensors copied into one
// trunk.bin, each layer at a 4096-aligned offset, so a layer is ONE aligned O_DIRECT read from a
// known offset; trunk.json describes it.
//
// trunk.json (a superset of the reference's fields, which readers of either may rely on):
//   {"format":"k3flow-trunk","version":1,"n_layers":N,"align":4096,"tensor_align":64,
//    "checksum":"xxh64",
//    "source":{"sample_bytes":4096,"shards":[{"file":"<shard file name>","bytes":S,"header_xxh64":"<hex>"}],
//              "layer_samples":["<16 hex digits>", one per layer]},
//    "layers":[{"layer":L,"file_off":F,"nbytes":B,"xxh64":"<16 hex digits>",
//               "tensors":{"<full name>":{"off":O,"nbytes":n,"dtype":"BF16","shape":[...]}}}]}
//   file_off: 4096-aligned offset in trunk.bin; nbytes: the layer's length rounded up to 4096
//   (the read length); off: relative to the layer's first byte, 64-aligned (tensors are copied one
//   by one, so a layer need not be contiguous in its shard and SIMD loads stay aligned); padding is
//   zero. xxh64: XXH64 (seed 0) of the layer's `nbytes` bytes exactly as stored, padding included.
//   open() also accepts the reference tools' trunk.json (no "xxh64"; its extra fields ignored), but
//   a run refuses any trunk.json without "source" (check_source: re-run pack-trunk) -- safer than
//   streaming bytes nobody can tie to the checkpoint -- and checks each layer's "xxh64" the first
//   time the layer is read (check_loaded: hashing runs at ~20 GB/s on one core, once per layer and
//   process, so there is no switch to turn it off).
//   source: what the trunk was packed from, checked by check_source() before a run uses the trunk:
//   every shard's file name, size and XXH64 of its safetensors header (8-byte length + JSON), and
//   per layer the XXH64 of the first `sample_bytes` bytes of each of its tensors in the shards (in
//   the layer's tensor order), so a checkpoint with the same shapes but other values (another seed,
//   a fine-tune) is told apart without reading it whole. config.json is not part of it: the
//   trunk's bytes depend on the shards only (the layer count is checked separately).
//
// Compressed trunks (pack-trunk --codec exp4|huff, docs/codec.md): trunk.json has top-level
// "codec":"<name>" (absent = "none") and per layer "stored_bytes" (the read length at file_off, a
// 4096-multiple) and "compressed_bytes" (the codec stream's exact length, <= stored_bytes); nbytes
// and the tensor offsets then describe the DECODED layer image and xxh64 hashes the decoded bytes.
// The stream carries a block index (a layer decodes in parallel chunks) and per-block checks.
//
// A pack writes trunk.bin.partial and trunk.json.partial and renames them only when both are
// complete (trunk.json last), so an interrupted pack never leaves a file that looks complete.
#pragma once
#include <array>
#include <atomic>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "io/codec/codec.hpp"
#include "io/file.hpp"
#include "io/safetensors.hpp"
#include "io/xxh64.hpp"

namespace k3::io {

constexpr uint64_t kTrunkAlign = 4096;
constexpr uint64_t kTrunkTensorAlign = 64;

struct TrunkTensor {
  std::string name;
  DType dtype = DType::U8;
  uint8_t rank = 0;
  std::array<uint64_t, 4> shape{1, 1, 1, 1};
  uint64_t off = 0;  // from the layer's first byte
  uint64_t nbytes = 0;
};

struct TrunkLayer {
  int layer = 0;
  uint64_t file_off = 0;          // in trunk.bin, 4096-aligned
  uint64_t nbytes = 0;            // 4096-multiple: the layer's (decoded) bytes; the read length when raw
  uint64_t xxh64 = 0;             // of those bytes (decoded)
  uint64_t stored_bytes = 0;      // bytes at file_off to read (4096-multiple); == nbytes when raw
  uint64_t compressed_bytes = 0;  // the codec stream's length; == nbytes when raw
  bool has_xxh64 = false;         // false for a trunk.json without checksums (the reference tools' format)
  std::vector<TrunkTensor> tensors;
  const TrunkTensor* find(std::string_view name) const;  // nullptr when absent
};

// `language_model.model.layers.L.<rest>` that is not a routed expert tensor -> L; else -1.
int trunk_layer_of(std::string_view tensor_name);

// Where pack-trunk puts every layer's tensors, from the shard index alone (checksums left 0).
// `sources[l][i]` is where layers[l].tensors[i] comes from. Tensors of a layer keep their order in
// the shards. Throws runtime Error naming the layer when one of 0..n_layers-1 has no tensors, or a
// tensor names a layer >= n_layers.
struct TrunkLayout {
  std::vector<TrunkLayer> layers;
  std::vector<std::vector<TensorInfo>> sources;
  uint64_t file_bytes = 0;
};
TrunkLayout layout_trunk(const ShardSet& shards, int n_layers);

// What a trunk was packed from (trunk.json "source"); see above.
constexpr uint64_t kTrunkSampleBytes = 4096;
struct TrunkSourceShard {
  std::string file;  // file name only
  uint64_t bytes = 0;
  uint64_t header_xxh64 = 0;
};
struct TrunkSource {
  std::vector<TrunkSourceShard> shards;
  std::vector<uint64_t> layer_samples;
};
// The fingerprint of `shards` for a trunk whose layer l holds the tensors `sources[l]` (in order).
// Reads every shard's header and <= 4 KiB of each tensor. Throws runtime Error naming the shard.
TrunkSource trunk_source(const ShardSet& shards, const std::vector<std::vector<TensorInfo>>& sources);

struct PackStats {
  uint64_t bytes_written = 0;  // trunk.bin size
  uint64_t raw_bytes = 0;      // the layers' decoded bytes (== bytes_written without a codec)
  double encode_seconds = 0;   // spent in the codec
  uint64_t payload_bytes = 0;  // tensor bytes (without padding)
  uint64_t largest_layer = 0;
  double seconds = 0;
};

// Packs into dir/trunk.bin + dir/trunk.json (dir is created). `progress(done, total)` is called
// after every chunk written; `cancelled` (may be null) is polled before every chunk and before the
// final renames: when it returns true the pack throws runtime Error "pack-trunk: interrupted".
// Test hook: env K3FLOW_FAIL_AFTER_BYTES=N stops the pack once N bytes are written, by throwing
// (K3FLOW_FAIL_MODE unset), by SIGKILL (K3FLOW_FAIL_MODE=kill), or by waiting (at most 60 s) until
// `cancelled` returns true (K3FLOW_FAIL_MODE=wait, for signal tests).
// Throws Error naming the file on any failure; a thrown pack removes its .partial files and the
// directories it created (when they are then empty).
// With a codec other than none each layer is assembled in memory (its decoded image and its
// stream: ~1.8x the largest layer), encoded, and written at the next 4096-aligned offset.
PackStats pack_trunk(const ShardSet& shards, int n_layers, const std::filesystem::path& dir,
                     const std::function<void(uint64_t done, uint64_t total)>& progress = {},
                     bool (*cancelled)() = nullptr, codec::Codec codec = codec::Codec::none);

// An opened, validated packed trunk. Validation (one-line runtime Error naming the file): JSON
// shape, align == 4096, layer count == expected, layer i has "layer" i, file_off/nbytes
// 4096-multiples, layers inside trunk.bin (no wrap-around of file_off + nbytes) and not
// overlapping, every tensor inside its layer with nbytes == numel x dtype size (no overflow).
class PackedTrunk {
 public:
  static PackedTrunk open(const std::filesystem::path& dir, int expected_layers,
                          File::Mode mode = File::Mode::direct_preferred);

  const File& file() const { return file_; }
  const std::filesystem::path& json_path() const { return json_path_; }
  uint64_t align() const { return kTrunkAlign; }
  const std::vector<TrunkLayer>& layers() const { return layers_; }
  codec::Codec codec() const { return codec_; }
  uint64_t stored_bytes() const;  // sum over layers (the bytes a pass reads)
  uint64_t raw_bytes() const;     // sum of the decoded layers' nbytes
  const TrunkLayer& layer(int l) const { return layers_.at(size_t(l)); }
  uint64_t largest_layer() const;
  size_t index_bytes() const;  // heap bytes this description holds

  // Reads layer l (decoding it when compressed) and compares its XXH64 with trunk.json; throws
  // runtime Error naming trunk.bin and the layer on a mismatch, a read failure, a corrupted stream
  // (with the block and the file offset), or when trunk.json records no checksum.
  void verify_layer(int l) const;

  // Compressed trunks: `stored` holds layer l's stored_bytes as read from trunk.bin; decodes them
  // into `out` (nbytes), blocks in parallel chunks (oneTBB), every block check verified, then the
  // decoded XXH64 compared with trunk.json. Throws runtime Error "codec: <trunk.bin> layer L: block
  // B ... (at byte offset O)" with O an offset in trunk.bin.
  void decode_layer(int l, std::span<const std::byte> stored, std::span<std::byte> out) const;

  // Compressed trunks: layer l's codec stream in `stored` (its stored bytes as read), parsed with
  // the header check and its decoded length checked against nbytes; every error names trunk.bin,
  // the layer and a trunk.bin offset. The streaming graph's decode stage decodes its blocks in
  // parallel (Stream::decode_blocks); `stored` must outlive the stream.
  codec::Stream layer_stream(int l, std::span<const std::byte> stored) const;

  // Refuses (runtime Error naming the trunk directory and what differs, asking to re-run
  // pack-trunk) a trunk whose trunk.json "source" does not match `shards`, or that records no
  // source (written before pack-trunk recorded one). Reads the shards' headers and samples.
  void check_source(const ShardSet& shards) const;
  bool has_source() const { return has_source_; }
  const TrunkSource& source() const { return source_; }

  // `bytes` holds layer l as just read from trunk.bin (at least its nbytes). The first call for a
  // layer in this process hashes them and compares with trunk.json (runtime Error naming trunk.bin
  // and the layer on a mismatch, or when trunk.json has no checksum); later calls return at once.
  // Thread-safe.
  void check_loaded(int l, std::span<const std::byte> bytes) const;
  // check_loaded for a layer whose decoded bytes were hashed as they streamed past (the fused
  // decode's first pass: the decoded slot never holds the whole layer): `xxh64` is their XXH64.
  void check_loaded_digest(int l, uint64_t xxh64) const;

 private:
  explicit PackedTrunk(File f) : file_(std::move(f)) {}
  File file_;
  std::filesystem::path json_path_;
  std::vector<TrunkLayer> layers_;
  TrunkSource source_;
  bool has_source_ = false;
  codec::Codec codec_ = codec::Codec::none;
  std::unique_ptr<std::atomic<bool>[]> loaded_ok_;  // per layer: check_loaded passed
};

}  // namespace k3::io
