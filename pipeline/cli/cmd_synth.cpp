// `k3flow synth OUT_DIR`: write a synthetic checkpoint in the released format (io/synth/synth.hpp).
#include <fmt/format.h>

#include <charconv>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "io/error.hpp"
#include "io/synth/synth.hpp"
#include "pipeline/cli/commands.hpp"
#include "pipeline/support/human_bytes.hpp"
#include "pipeline/support/interrupt.hpp"
#include "pipeline/support/output_file.hpp"
#include "pipeline/support/progress.hpp"

namespace k3::pipeline {

namespace {

struct DimFlag {
  const char* flag;
  int io::ModelConfig::*field;
  const char* help;
};

constexpr DimFlag kDimFlags[] = {
    {"--layers", &io::ModelConfig::n_layers, "decoder layers"},
    {"--hidden", &io::ModelConfig::hidden, "hidden size"},
    {"--vocab", &io::ModelConfig::vocab, "vocabulary size"},
    {"--heads", &io::ModelConfig::kda_heads, "KDA heads"},
    {"--head-dim", &io::ModelConfig::kda_head_dim, "KDA head dim (d_k = d_v)"},
    {"--conv-kernel", &io::ModelConfig::conv_kernel, "KDA short-conv taps"},
    {"--mla-heads", &io::ModelConfig::mla_heads, "MLA heads"},
    {"--q-lora", &io::ModelConfig::q_lora_rank, "MLA q_lora_rank"},
    {"--kv-lora", &io::ModelConfig::kv_lora_rank, "MLA kv_lora_rank"},
    {"--qk-nope", &io::ModelConfig::qk_nope, "MLA qk_nope_head_dim"},
    {"--qk-rope", &io::ModelConfig::qk_rope, "MLA qk_rope_head_dim"},
    {"--v-head", &io::ModelConfig::v_head, "MLA v_head_dim"},
    {"--experts", &io::ModelConfig::n_experts, "routed experts per MoE layer"},
    {"--top-k", &io::ModelConfig::top_k, "experts per token"},
    {"--shared", &io::ModelConfig::n_shared, "shared experts (fused)"},
    {"--latent", &io::ModelConfig::latent, "routed expert latent width (multiple of 32)"},
    {"--moe-inter", &io::ModelConfig::moe_inter, "expert intermediate size (multiple of 32)"},
    {"--dense-inter", &io::ModelConfig::dense_inter, "dense MLP intermediate size"},
    {"--block-size", &io::ModelConfig::attn_res_block, "AttnRes block size"},
    {"--first-dense", &io::ModelConfig::first_dense, "leading dense (non-MoE) layers"},
};

std::vector<int> parse_layer_list(const std::string& text) {
  std::vector<int> v;
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t end = text.find(',', pos);
    if (end == std::string::npos) end = text.size();
    std::string item = text.substr(pos, end - pos);
    const size_t a = item.find_first_not_of(" \t"), b = item.find_last_not_of(" \t");
    item = a == std::string::npos ? "" : item.substr(a, b - a + 1);
    int value = 0;
    auto [ptr, ec] = std::from_chars(item.data(), item.data() + item.size(), value);
    if (item.empty() || ec != std::errc() || ptr != item.data() + item.size())
      throw io::usage_error(
          fmt::format("--full-attn '{}' is not a comma-separated list of one-based layer numbers", text));
    v.push_back(value);
    pos = end + 1;
  }
  return v;
}

struct SynthArgs {
  std::string out_dir;
  std::string size = "tiny";
  bool sparse = false, force = false, dry_run = false, progress = false, no_progress = false;
  uint64_t seed = 1;
  int shards = 0;
  std::string full_attn;
  std::string ranks = K3_DEFAULT_RANKS;
  int dims[std::size(kDimFlags)] = {};
  CLI::Option* dim_opts[std::size(kDimFlags)] = {};
  CLI::Option *size_opt = nullptr, *full_attn_opt = nullptr, *ranks_opt = nullptr;
};

int run_synth(SynthArgs& a) {
  if (std::error_code ec;
      std::filesystem::exists(a.out_dir, ec) && !std::filesystem::is_directory(a.out_dir, ec))
    throw io::usage_error(fmt::format("OUT_DIR {}: is not a directory", a.out_dir));
  if (a.ranks_opt->count()) check_input_file(a.ranks, "--ranks");
  io::synth::SynthCheckpoint plan;
  if (a.sparse) {
    plan = io::synth::layout_sparse();
  } else {
    io::ModelConfig c = io::synth::preset_dims(a.size);
    for (size_t i = 0; i < std::size(kDimFlags); ++i)
      if (a.dim_opts[i]->count()) c.*kDimFlags[i].field = a.dims[i];
    if (a.full_attn_opt->count())
      c.full_attn_layers = parse_layer_list(a.full_attn);
    else
      c.full_attn_layers = io::synth::default_full_attn(c.n_layers);
    plan = io::synth::layout_dense(c, a.shards);
  }

  std::string tokenizer_note;
  io::synth::synth_tokenizer(plan.config.vocab, a.ranks, plan, tokenizer_note);
  const uint64_t data = plan.data_bytes();
  if (a.dry_run) {
    fmt::print("synth plan: {} tensors in {} shards, {} data bytes ({}){}\n{}\n", plan.tensor_count(),
               plan.shards.size(), data, human_bytes(double(data)),
               plan.sparse ? ", sparse (headers only)" : "", plan.config.summary());
    return 0;
  }

  Progress bar("synth", a.progress      ? Progress::Mode::always
                        : a.no_progress ? Progress::Mode::never
                                        : Progress::Mode::automatic);
  // Ctrl-C / SIGTERM while writing: stop at the next block and remove the partial output.
  InterruptScope interrupts;
  io::synth::SynthOptions opt;
  opt.cancelled = &InterruptScope::requested;
  opt.seed = a.seed;
  opt.overwrite = a.force;
  if (bar.enabled()) opt.progress = [&bar](uint64_t done, uint64_t total) { bar.update(done, total); };
  io::synth::SynthReport r;
  try {
    r = io::synth::write_checkpoint(plan, a.out_dir, opt);
  } catch (const io::Error& e) {
    if (!InterruptScope::requested()) throw;
    // Stopped by the signal, not failed: the exit code says which (130 / 143), as in every command.
    std::fprintf(stderr, "k3flow: synth: %s (%s)\n", e.what(),
                 InterruptScope::signal_number() == SIGTERM ? "SIGTERM" : "SIGINT");
    return interrupted_exit_code();
  }
  bar.finish();

  fmt::print("synth: {}\n", tokenizer_note);
  if (plan.sparse) {
    fmt::print(
        "synth: sparse replica of the released checkpoint in {}: {} tensors, {} shards, {} bytes logical "
        "({}) "
        "in {:.2f} s\n",
        a.out_dir, r.tensors, r.shards, r.logical_bytes, human_bytes(double(r.logical_bytes)), r.seconds);
  } else {
    fmt::print("synth: {} tensors, {} shards, {} bytes ({}) written to {} in {:.2f} s = {} (seed {})\n",
               r.tensors, r.shards, r.logical_bytes, human_bytes(double(r.logical_bytes)), a.out_dir,
               r.seconds, human_rate(r.seconds > 0 ? r.logical_bytes / r.seconds : 0.0), a.seed);
  }
  return 0;
}

}  // namespace

Action add_synth(CLI::App& sub) {
  auto a = std::make_shared<SynthArgs>();
  sub.add_option("OUT_DIR", a->out_dir, "directory to write (created; must not hold a checkpoint)")
      ->required();
  a->size_opt = sub.add_option("--size", a->size,
                               "named dense size: tiny (6.4 MiB), small (289 MiB), medium (2.8 GiB), "
                               "large (11.3 GiB) of weights; other flags override its dimensions")
                    ->capture_default_str();
  CLI::Option* sparse = sub.add_flag("--sparse", a->sparse,
                                     "full-scale replica of the released model: headers only, sparse files");
  sub.add_option("--seed", a->seed, "pseudo-random seed (same seed, same bytes)")
      ->capture_default_str()
      ->excludes(sparse);
  sub.add_option("--shards", a->shards,
                 "number of shard files (default: one per layer plus one for the head)")
      ->excludes(sparse);
  for (size_t i = 0; i < std::size(kDimFlags); ++i)
    a->dim_opts[i] = sub.add_option(kDimFlags[i].flag, a->dims[i], kDimFlags[i].help)->excludes(sparse);
  a->full_attn_opt = sub.add_option("--full-attn", a->full_attn,
                                    "one-based MLA layers, e.g. \"4,8,12\" (default: every 4th and the last)")
                         ->excludes(sparse);
  a->size_opt->excludes(sparse);
  a->ranks_opt =
      sub.add_option("--ranks", a->ranks,
                     "tiktoken rank file whose first ranks make the synthetic tokenizer (default: the o200k "
                     "ranks in the source tree; byte-level when absent)")
          ->capture_default_str();
  sub.add_flag("--force", a->force, "replace the checkpoint files already in OUT_DIR");
  sub.add_flag("--dry-run", a->dry_run, "print the plan (tensors, shards, bytes) and write nothing");
  sub.add_flag("--progress", a->progress, "draw the progress bar even when stderr is not a terminal");
  sub.add_flag("--no-progress", a->no_progress, "never draw the progress bar");
  return [a] { return run_synth(*a); };
}

}  // namespace k3::pipeline
