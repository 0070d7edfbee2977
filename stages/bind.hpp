// Weight views over bytes already in memory (docs/model.md §2). Projections stay in their stored type
// (F32 / BF16 views, MXFP4 for released experts); small vectors are widened exactly to f32 into a
// caller-given area. Nothing here owns weight memory except ResidentModel at the end.
//
// Binding a layer from a slot buffer (streaming engine):
//   Layout lay = locate(layer_tensors(cfg, l).tensors, shards, cfg);    // once per layer, at start
//   read lay.buffer_bytes into the slot so its first byte sits at an address == lay.base_mod8
//   (mod 8) -- an O_DIRECT window read keeps the file's alignment, so it does -- then
//   LayerWeights w = bind_layer(cfg, l, lay, slot_bytes, widen_area /* lay.widen_floats */);
// and per expert: Layout e = locate_expert(shards, cfg, l, e); ... bind_expert(e, bytes, widen).
// Bytes packed some other way (a trunk file with its own offsets): build the Layout with place()
// from the per-tensor offsets, then bind_layer the same way.
#pragma once
#include <cstddef>
#include <memory>
#include <optional>
#include <span>
#include <utility>
#include <variant>
#include <vector>

#include "io/aligned.hpp"
#include "io/config.hpp"
#include "io/safetensors.hpp"
#include "kernels/weights.hpp"
#include "stages/tensors.hpp"

namespace k3::stages {

class ExpertExchange;  // stages/moe.hpp: expert parallel over several processes

using Vec = std::span<const float>;
using kernels::DenseMatrix;
using kernels::Matrix;

struct KdaWeights {
  Matrix q, k, v, g, o, f_a, f_b, b;
  Vec q_conv, k_conv, v_conv;  // [P][K], tap K-1 multiplies the current input
  Vec a_log;                   // H values: A_log is per HEAD (the released tensor pads it to D)
  Vec dt_bias, o_norm;
};

struct MlaWeights {
  Matrix q_a, q_b, kv_a, kv_b, o;
  std::optional<Matrix> g;  // output gate, present iff mla_out_gate
  Vec q_a_norm, kv_a_norm;
};

struct DenseFfnWeights {
  Matrix gate, up, down;
};

struct MoeWeights {
  DenseMatrix router;
  Vec bias, norm;
  Matrix down, up;  // latent projections W_down [L][E], W_up [E][L]
  Matrix shared_gate, shared_up, shared_down;
  // Set when this process holds only some of the layer's routed experts (docs/distributed.md §2):
  // moe_forward computes the ones it owns and gets the others' outputs through it.
  ExpertExchange* exchange = nullptr;
};

struct ExpertWeights {
  Matrix w1, w2, w3;  // gate [I][L], down [L][I], up [I][L]
};

struct LayerWeights {
  int layer = 0;
  io::LayerKind kind{};
  Vec input_norm, post_attn_norm, attn_res_norm, attn_res_proj, mlp_res_norm, mlp_res_proj;
  std::variant<KdaWeights, MlaWeights> attn;
  std::variant<DenseFfnWeights, MoeWeights> ffn;
};

struct HeadWeights {
  DenseMatrix embed;  // [vocab][hidden], rows gathered and widened exactly
  Vec final_norm, out_res_norm, out_res_proj;
  Matrix lm_head;
};

// Views over `bytes` (the layout's buffer; see the alignment rule above). `widen` must hold
// lay.widen_floats floats and outlive the views. Throws io::Error on a contract violation.
//
// A compressed trunk layer bound for the fused decode (docs/codec.md, "Fused decode"): its aligned
// BF16 projections (not the router, not vectors) become kernels::CodedBf16Matrix views of `src`,
// whose value i is bytes [2i, 2i + 2) of the decoded layer image and whose byte `first_byte` is
// bytes[0]; the rest is bound from `bytes` as usual. `coded` (if set) gets the byte ranges of the
// image bound coded: bind never reads them, so they need not be decoded.
struct CodedLayer {
  const kernels::Bf16Source* src = nullptr;
  uint64_t first_byte = 0;
  std::vector<std::pair<uint64_t, uint64_t>>* coded = nullptr;
};
LayerWeights bind_layer(const io::ModelConfig&, int layer, const Layout&, std::span<const std::byte> bytes,
                        std::span<float> widen, const CodedLayer& coded = {});
// The byte ranges of the decoded layer image (starting at `first_byte` = bytes[0] as above) that
// bind_layer binds coded for a fused decode, ascending, read from nothing: what the decode stage
// need not decode and the decoded slot need not hold (the graph and the planner know them before
// a layer is read).
std::vector<std::pair<uint64_t, uint64_t>> coded_ranges(const io::ModelConfig&, int layer, const Layout&,
                                                        uint64_t first_byte);
ExpertWeights bind_expert(const io::ModelConfig&, const Layout&, std::span<const std::byte> bytes,
                          std::span<float> widen);
HeadWeights bind_head(const io::ModelConfig&, const Layout&, std::span<const std::byte> bytes,
                      std::span<float> widen);

// Where the forward pass gets its weights; the resident model below, or a streaming engine.
class WeightSource {
 public:
  virtual ~WeightSource() = default;
  virtual const io::ModelConfig& config() const = 0;
  virtual int bound_layers() const = 0;
  virtual const HeadWeights& head() const = 0;
  virtual const LayerWeights& layer(int l) const = 0;
  virtual const ExpertWeights& expert(int l, int e) const = 0;
};

// Every bound layer, its experts and the head read from the ShardSet into owned aligned buffers
// (one read per contiguous layer run). For the tiny oracle and small checkpoints.
class ResidentModel final : public WeightSource {
 public:
  // n_layers <= 0 or >= config n_layers binds all. Throws io::Error naming the tensor on failure.
  // With `experts` (expert parallel, docs/distributed.md §2) only the routed experts it owns are
  // located and read, and every MoE layer's weights carry it; expert() of another is an error.
  static std::unique_ptr<ResidentModel> load(const io::ShardSet&, const io::ModelConfig&, int n_layers = 0,
                                             ExpertExchange* experts = nullptr);

  const io::ModelConfig& config() const override { return cfg_; }
  int bound_layers() const override { return static_cast<int>(layers_.size()); }
  const HeadWeights& head() const override { return head_.w; }
  const LayerWeights& layer(int l) const override { return layers_[l].w; }
  const ExpertWeights& expert(int l, int e) const override;
  size_t weight_bytes() const { return bytes_; }

 private:
  struct Piece {
    io::AlignedBuffer bytes;
    std::vector<float> widen;
  };
  struct Expert {
    Piece mem;
    ExpertWeights w;
    bool held = false;  // false: another process owns it (expert parallel)
  };
  struct Layer {
    Piece mem;
    LayerWeights w;
    std::vector<Expert> experts;
  };
  struct Head {
    Piece mem;
    HeadWeights w;
  };
  io::ModelConfig cfg_;
  std::vector<Layer> layers_;
  Head head_;
  size_t bytes_ = 0;
};

}  // namespace k3::stages
