// Synthetic Kimi K3 checkpoints in the released format (docs/design.md §7): sharded safetensors with
// model.safetensors.index.json and a nested config.json, real tensor names, bf16 trunk, MXFP4
// experts. Two kinds:
//   dense  — small models of any shape, deterministic pseudo-random values scaled so a forward
//            pass stays finite and non-degenerate (same seed -> same bytes);
//   sparse — a full-scale replica of the released model (io/k3_names): every tensor, headers only,
//            files extended to their logical size without data blocks.
#pragma once
#include <atomic>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "io/config.hpp"
#include "io/safetensors_writer.hpp"

namespace k3::io::synth {

// How a tensor's values are generated (dense checkpoints).
enum class Fill : uint8_t {
  none,          // sparse replica: no data
  normal,        // N(0, scale) — projection matrices, conv taps, router, AttnRes pseudo-queries
  gain,          // 1 + N(0, scale) — norm gains
  a_log,         // F32 [D]: first `valid` values uniform in [-0.5, 1], the rest exactly 0
  mxfp4_packed,  // U8: random E2M1 nibble pairs (every code is valid)
  mxfp4_scale,   // U8: E8M0 exponents in center±1, never 0 or 255
};

struct SynthTensor {
  io::TensorEntry entry;
  int layer = -1;   // -1 = model level
  int expert = -1;  // routed expert index, else -1
  Fill fill = Fill::none;
  float scale = 0;  // normal/gain: standard deviation
  int center = 0;   // mxfp4_scale: exponent byte the scales cluster around
  int valid = 0;    // a_log: how many leading values are used (the KDA head count)
};

struct SynthShard {
  std::string file;  // model-NNNNN-of-NNNNNN.safetensors
  std::vector<SynthTensor> tensors;
  uint64_t data_bytes() const;
};

struct SynthCheckpoint {
  io::ModelConfig config;
  std::string config_text;  // config.json as written; empty = config_json(config)
  std::vector<SynthShard> shards;
  bool sparse = false;
  // tiktoken.model + tokenizer_config.json written beside the shards; empty = none.
  std::string tiktoken_model, tokenizer_config;
  size_t tensor_count() const;
  uint64_t data_bytes() const;
};

// The released model's dimensions (docs/model.md §1.2, "real" column).
io::ModelConfig real_dims();
// Named dense sizes shaped like K3 (many experts, few layers): tiny ≈ 7 MB, small ≈ 0.3 GB,
// medium ≈ 3 GB, large ≈ 12 GB. Throws usage Error naming --size for an unknown name.
io::ModelConfig preset_dims(std::string_view name);
// The released MLA placement rule (one-based): every 4th layer, plus the last (4,8,…,92,93).
std::vector<int> default_full_attn(int n_layers);
// Refuses dimensions a dense checkpoint cannot have, naming the flag (usage Error, exit 2).
void validate_dims(const io::ModelConfig& c);

// Tensor list of a dense checkpoint: one shard per layer plus one for the model-level tensors
// (shards == 0, like the released layout), or whole layers packed into `shards` files by bytes.
// Within a layer, data order is the released one (F32, then BF16, then U8, each by name), so each
// layer's trunk is contiguous and each expert's six MXFP4 tensors are contiguous in the order
// w1.packed, w1.scale, w2.packed, w2.scale, w3.packed, w3.scale. Dtypes follow io/k3_names.
SynthCheckpoint layout_dense(const io::ModelConfig& c, int shards);
// The full-scale replica of the released checkpoint, from io/k3_names.
SynthCheckpoint layout_sparse();

std::string shard_file_name(int index, int count);  // index is zero-based

// Values of bytes [offset, offset + out.size()) of tensor `t` for seed `seed`. Each 1 MiB chunk
// of a tensor has its own generator stream keyed by (seed, tensor name, chunk), so any split of
// the work, any thread count and any shard packing produce the same bytes.
void fill_bytes(const SynthTensor& t, uint64_t seed, uint64_t offset, std::span<std::byte> out);
constexpr uint64_t kFillChunk = uint64_t{1} << 20;

// Text of config.json (nested, as the released file spells it) and of the index.
std::string config_json(const io::ModelConfig& c);
std::string index_json(const SynthCheckpoint& plan);

// A tokenizer for a synthetic checkpoint whose vocabulary has `vocab` ids, laid out like K3's
// (ordinary ranks first, then a block of 256 specials whose names and offsets are K3's: [BOS],
// [EOS], <|end_of_msg|>, <|open|>, ...), so text and the XTML chat work on it:
//   vocab >= 512: the first vocab - 256 ranks of `ranks_file` (a tiktoken rank file such as o200k,
//                 whose first 256 ranks are the single bytes) + the special block at the top;
//   256..511:     byte-level ranks, and every further id a reserved special (no XTML controls);
//   < 256:        none (a byte-level vocabulary needs 256 ids): returns false.
// Ranks beyond what `ranks_file` holds, or with no ranks file, stay byte-level; the ids between
// the ranks and the special block are reserved specials. `description` says which was chosen.
bool synth_tokenizer(int vocab, const std::filesystem::path& ranks_file, SynthCheckpoint& plan,
                     std::string& description);

struct SynthOptions {
  uint64_t seed = 0;
  bool overwrite = false;  // replace checkpoint files already in the output directory
  // Called with (bytes done, bytes total) from the writing thread; may be empty.
  std::function<void(uint64_t, uint64_t)> progress;
  // Polled between blocks; true stops the run, which fails and removes what it created.
  bool (*cancelled)() = nullptr;
};

struct SynthReport {
  size_t shards = 0, tensors = 0;
  uint64_t logical_bytes = 0;  // sum of file sizes
  uint64_t data_written = 0;   // bytes actually generated and written
  double seconds = 0;
};

// The refusal when `out_dir` has `avail` bytes free and the checkpoint needs `need` (> avail): both
// in exact bytes and in binary units (GiB), so two close sizes never print alike.
std::string free_space_refusal(const std::filesystem::path& out_dir, uint64_t avail, uint64_t need);

// Writes `plan` into `out_dir` (created if absent; it must hold no finished checkpoint files unless
// options.overwrite; leftover .partial files of a killed run are removed). Shards are
// written as .partial and renamed only after every shard is complete; the config and index come
// last. On any failure everything this call created is removed and the error rethrown.
// K3_SYNTH_FAIL_AFTER=N (environment) forces a failure after N data bytes, for tests.
SynthReport write_checkpoint(const SynthCheckpoint& plan, const std::filesystem::path& out_dir,
                             const SynthOptions& options);

}  // namespace k3::io::synth
