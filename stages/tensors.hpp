// The tensors every layer needs from the checkpoint, under the released names (docs/model.md §2.1):
// a list of {name, expected shape, field}, taken from io/released_tensors.hpp and independent of
// where the bytes live, and where those bytes are (Layout). The streaming engine packs / reads a
// layer's bytes by it; bind.hpp turns bytes already in memory into weight views.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "io/config.hpp"
#include "io/released_tensors.hpp"
#include "io/safetensors.hpp"

namespace k3::stages {

// Which weight a tensor is; the binder assigns views by field, never by name.
using Field = io::TensorField;

enum class Storage : uint8_t {
  matrix,  // projection: viewed as F32/BF16 in place (widened only if F16 or misaligned)
  vector,  // small vector: always widened exactly to f32 at bind
  mxfp4,   // U8 packed nibbles or E8M0 scales of a routed expert
};

const char* field_name(Field);
Storage storage_of(Field);

struct TensorSpec {
  std::string name;             // full released name
  std::vector<uint64_t> shape;  // expected shape; the binder checks the element count only
  Field field;
  uint64_t numel() const;
};

// A layer's trunk (everything of `layers.L.` except the routed experts), in a fixed order.
struct LayerTensors {
  int layer = 0;
  io::LayerKind kind{};
  std::vector<TensorSpec> tensors;
};

LayerTensors layer_tensors(const io::ModelConfig&, int layer);

// embed_tokens, norm, output_attn_res_norm, output_attn_res_proj, lm_head.
std::vector<TensorSpec> model_tensors(const io::ModelConfig&);

using io::ExpertFormat;

// One routed expert's tensors in canonical order (w1, w2, w3; packed before scale).
std::vector<TensorSpec> expert_tensors(const io::ModelConfig&, int layer, int expert, ExpertFormat);

// Name helpers (prefix `language_model.model.`; the head is `language_model.lm_head.weight`).
using io::expert_prefix;
using io::layer_prefix;  // "language_model.model.layers.L."

// Where a list of tensors lives and how to lay it out in one byte buffer.
struct Placement {
  io::TensorInfo info;  // from the shard index
  uint64_t offset = 0;  // of the tensor's first byte inside the layer buffer
};

struct Layout {
  std::vector<TensorSpec> specs;
  std::vector<Placement> places;  // parallel to specs
  // contiguous: every tensor is in one shard and together they tile [run_begin, run_end) with no
  // gap, so one read of that range fills the buffer (offsets = file offset - run_begin). Else the
  // tensors are read one by one to 64-byte aligned offsets.
  bool contiguous = false;
  uint32_t shard = 0;
  uint64_t run_begin = 0, run_end = 0;
  uint64_t buffer_bytes = 0;  // bytes of the layer buffer the offsets index
  // The buffer's first byte must sit at an address congruent to this modulo 8 (run_begin % 8 for
  // a contiguous run, 0 otherwise), so that F32 / BF16 tensors keep their natural alignment.
  uint32_t base_mod8 = 0;
  uint64_t widen_floats = 0;  // f32 scratch the binder needs for widened vectors / matrices
};

// Looks every spec up, refusing `missing tensor <name>` or `<name> has N elements, engine expects
// M` (io::Error, runtime kind). A KDA A_log may hold D values (released) or exactly H (tiny).
Layout locate(std::vector<TensorSpec> specs, const io::ShardSet&, const io::ModelConfig&);

// The same checks over bytes laid out by someone else (a packed trunk layer, a slot): `lookup`
// returns each tensor's dtype / shape / nbytes (in `info`; its shard and file offset are ignored)
// and its offset inside a `buffer_bytes` buffer whose first byte sits at an address == base_mod8
// (mod 8), or nullopt when absent.
using PlacementLookup = std::function<std::optional<Placement>(const std::string& name)>;
Layout place(std::vector<TensorSpec> specs, const PlacementLookup& lookup, const io::ModelConfig&,
             uint64_t buffer_bytes, uint32_t base_mod8 = 0);

// expert_tensors in whichever form the checkpoint holds (MXFP4 preferred), located and validated:
// U8, 2-D, equal rows, scale_cols * 32 == 2 * packed_cols, logical shape as the config says.
Layout locate_expert(const io::ShardSet&, const io::ModelConfig&, int layer, int expert);

// Reads a layout's tensors into `dst` (buffer_bytes long, at an address honouring base_mod8).
void read_layout(const Layout&, const io::ShardSet&, std::span<std::byte> dst);

}  // namespace k3::stages
