// `k3flow generate MODEL_DIR`: greedy decoding with the reference CLI's flags and meanings
// (ENGINE.md §5): token ids in, token ids out, a STEP table, k3_run.json, optional logits dump and
// K3ST state save / resume. Weights are bound resident from the ShardSet by their released names, or
// streamed through the flow graph within a memory budget (pipeline/streaming_run.hpp).
#include <fmt/format.h>
#include <tbb/global_control.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "io/config.hpp"
#include "io/error.hpp"
#include "io/safetensors.hpp"
#include "pipeline/commands.hpp"
#include "pipeline/human_bytes.hpp"
#include "pipeline/output_file.hpp"
#include "pipeline/run_report.hpp"
#include "pipeline/state_file.hpp"
#include "pipeline/streaming_run.hpp"
#include "stages/bind.hpp"
#include "stages/forward.hpp"
#include "stages/head.hpp"

namespace k3::pipeline {

namespace {

constexpr int kMaxGen = 4096;
constexpr size_t kMaxPositions = 36864;  // prompt + generation + 1, as the references cap it

struct GenerateOptions {
  std::string model_dir;
  std::optional<std::string> ids, prompt, prompt_file, tok, config, out_path, dump_logits, save_state,
      load_state;
  int gen = 8;
  bool incremental = false;
  int layers = 0;
  int threads = 0;
  StreamFlags stream;
};

double now() {
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}

// Strict: ids separated by commas and/or whitespace; anything else names the flag (exit 2).
std::vector<int32_t> parse_ids(const std::string& text) {
  std::vector<int32_t> out;
  size_t i = 0;
  auto sep = [](char ch) { return ch == ',' || ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r'; };
  while (i < text.size()) {
    if (sep(text[i])) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < text.size() && !sep(text[j])) ++j;
    const std::string tok = text.substr(i, j - i);
    int64_t v = 0;
    bool ok = !tok.empty() && tok.size() <= 10;
    for (char ch : tok) {
      if (ch < '0' || ch > '9') ok = false;
      if (ok) v = v * 10 + (ch - '0');
    }
    if (!ok || v > std::numeric_limits<int32_t>::max())
      throw io::usage_error(
          fmt::format("--ids: '{}' is not a token id (expected non-negative integers separated "
                      "by commas or spaces)",
                      tok));
    out.push_back(static_cast<int32_t>(v));
    i = j;
  }
  return out;
}

io::ModelConfig load_model_config(const GenerateOptions& o) {
  const std::filesystem::path path =
      o.config ? std::filesystem::path(*o.config) : std::filesystem::path(o.model_dir) / "config.json";
  if (!std::filesystem::exists(path))
    throw io::usage_error(fmt::format("no model config at {} (pass --config PATH)", path.string()));
  try {
    return io::load_config(path);
  } catch (const io::Error& e) {
    // A config that exists but cannot be trusted is a usage problem: never fall back to constants.
    throw io::usage_error(
        fmt::format("{}\nABORTED: the model config could not be read with confidence.", e.what()));
  }
}

int run_generate(const GenerateOptions& o) {
  const double t_start = now();
  // ---- usage checks that need no files ----
  const int sources = (o.ids ? 1 : 0) + (o.prompt ? 1 : 0) + (o.prompt_file ? 1 : 0);
  if (sources != 1)
    throw io::usage_error(
        fmt::format("exactly one of --ids, --prompt, --prompt-file is required ({} given)", sources));
  if (o.prompt || o.prompt_file) {
    const char* flag = o.prompt ? "--prompt" : "--prompt-file";
    if (!o.tok)
      throw io::usage_error(fmt::format("{} needs --tok DIR (text is tokenized); or pass --ids", flag));
    throw io::usage_error(fmt::format("{}: tokenizer not yet supported; pass token ids with --ids", flag));
  }
  std::vector<int32_t> prompt = parse_ids(*o.ids);
  if (prompt.empty() && !o.load_state) throw io::usage_error("--ids: no token ids given");
  if (o.load_state && !o.incremental) throw io::usage_error("--load-state needs --incremental");
  if (o.dump_logits && o.gen == 0) throw io::usage_error("--dump-logits needs --gen >= 1 (it dumps step 0)");

  std::optional<tbb::global_control> threads;
  if (o.threads > 0)
    threads.emplace(tbb::global_control::max_allowed_parallelism, static_cast<size_t>(o.threads));

  // ---- config ----
  const io::ModelConfig cfg = load_model_config(o);
  std::printf("%s\n", cfg.summary().c_str());
  for (int32_t id : prompt)
    if (id >= cfg.vocab)
      throw io::usage_error(
          fmt::format("--ids: token id {} is outside the vocabulary (0..{})", id, cfg.vocab - 1));
  const int n_layers = (o.layers <= 0 || o.layers >= cfg.n_layers) ? cfg.n_layers : o.layers;

  // ---- resume header before anything is sized ----
  std::optional<StateHeader> saved;
  if (o.load_state) saved = peek_state(*o.load_state);
  const size_t prior = saved ? static_cast<size_t>(saved->nseq) : 0;
  const size_t t_max = prior + prompt.size() + static_cast<size_t>(o.gen) + 1;
  if (t_max > kMaxPositions)
    throw io::usage_error(fmt::format("prompt + --gen + 1 = {} positions exceeds the {} this build allows",
                                      t_max, kMaxPositions));

  std::printf("\nKimi K3, k3flow, released checkpoint layout\n");
  std::printf("  model   : %s\n", o.model_dir.c_str());
  if (saved) {
    std::printf("  prompt  : %zu saved + %zu new ids\n", prior, prompt.size());
  } else {
    std::printf("  prompt  : %zu ids\n", prompt.size());
  }
  std::printf("  decode  : greedy, %s, %d tokens, threads %s\n",
              o.incremental ? "incremental (KV cache + carried KDA state)" : "full recompute", o.gen,
              o.threads > 0 ? std::to_string(o.threads).c_str() : "default");
  if (n_layers != cfg.n_layers)
    std::printf(
        "  NOTE    : --layers %d runs only the first %d of %d layers; the output is not the model's\n",
        n_layers, n_layers, cfg.n_layers);

  // ---- weights ----
  double t0 = now();
  const io::ShardSet shards = io::ShardSet::open(o.model_dir);
  std::printf("indexed %zu tensors from %zu shards in %.2f s\n", shards.tensor_count(), shards.shard_count(),
              now() - t0);
  t0 = now();
  const std::unique_ptr<StreamRun> stream = StreamRun::open(o.stream, cfg, shards, n_layers, t_max, o.gen);
  std::unique_ptr<stages::ResidentModel> model;
  if (!stream) {
    model = stages::ResidentModel::load(shards, cfg, n_layers);
    std::printf("resident weights: %s bound for %d layers in %.2f s\n",
                human_bytes(static_cast<double>(model->weight_bytes())).c_str(), n_layers, now() - t0);
  }
  std::printf("peak RSS after loading weights: %s\n",
              human_bytes(static_cast<double>(peak_rss_bytes())).c_str());

  // ---- state ----
  stages::DecodeState state(cfg, n_layers, t_max);
  std::printf("recurrent state for %d layers: %s\n", n_layers,
              human_bytes(static_cast<double>(state.kper()) * n_layers * 4).c_str());
  std::vector<int32_t> seq;
  if (saved) {
    t0 = now();
    load_state(*o.load_state, cfg, state, seq);
    std::printf("restored %zu positions from %s in %.2f s\n", state.cached, o.load_state->c_str(),
                now() - t0);
  }
  seq.insert(seq.end(), prompt.begin(), prompt.end());
  if (o.incremental) {
    std::printf(
        "incremental decode: KV cache %s for %d MLA layers at %zu positions\n",
        human_bytes(static_cast<double>(t_max) * (state.kvpp() + state.ropepp()) * state.n_mla() * 4).c_str(),
        state.n_mla(), t_max);
  }
  if (o.incremental && o.gen > 0 && seq.size() == state.cached)
    throw io::usage_error(
        "--load-state: nothing to feed (the saved state has no pending token and --ids is empty)");

  // ---- decode ----
  std::printf("\n%-6s %-10s %-12s %s\n", "STEP", "TOKEN", "SECONDS", "TOK/S");
  std::printf("----------------------------------------\n");
  stages::Scratch scratch;
  std::vector<float> logits(static_cast<size_t>(cfg.vocab)), step0_logits;
  std::vector<int32_t> generated;
  double t_steps = 0;
  for (int g = 0; g < o.gen; ++g) {
    const double ts = now();
    std::span<const int32_t> feed;
    if (o.incremental) {
      feed = std::span<const int32_t>(seq).subspan(state.cached);  // step 0: pending token + prompt; then 1
    } else {
      state.reset();  // full recompute: KDA state zeroed, whole prefix every step
      feed = seq;
    }
    if (stream)
      stream->forward(state, feed, logits);
    else
      stages::forward(*model, state, feed, stages::HeadAt::last, logits, scratch);
    const int32_t next = stages::greedy(logits);
    const double dt = now() - ts;
    t_steps += dt;
    if (stream) stream->record_step(g, next);
    if (g == 0 && o.dump_logits && stream) {
      step0_logits = logits;  // written after the last step: a failed run leaves no logits file
    } else if (g == 0 && o.dump_logits) {
      write_file_atomic(*o.dump_logits, std::as_bytes(std::span<const float>(logits)));
      std::printf("wrote %s (%d float32 logits)\n", o.dump_logits->c_str(), cfg.vocab);
    }
    seq.push_back(next);
    generated.push_back(next);
    std::printf("%-6d %-10d %-12.4f %.2f%s\n", g, next, dt, dt > 0 ? 1.0 / dt : 0.0,
                stream ? ("   " + stream->step_note()).c_str() : "");
    std::fflush(stdout);
  }
  std::printf("----------------------------------------\n");
  if (!step0_logits.empty()) {
    write_file_atomic(*o.dump_logits, std::as_bytes(std::span<const float>(step0_logits)));
    std::printf("wrote %s (%d float32 logits)\n", o.dump_logits->c_str(), cfg.vocab);
  }

  if (o.save_state) {
    if (!o.incremental) {
      std::fprintf(stderr, "k3flow: --save-state needs --incremental; nothing written\n");
    } else {
      const uint64_t bytes = save_state(*o.save_state, cfg, seq, state);
      std::printf("wrote %s (%s, %zu positions)\n", o.save_state->c_str(),
                  human_bytes(static_cast<double>(bytes)).c_str(), state.cached);
    }
  }
  const double spt = o.gen > 0 ? t_steps / o.gen : 0.0;
  std::printf("%d tokens in %.3f s, %.4f s/token average\n", o.gen, t_steps, spt);
  std::printf("generated ids:");
  for (int32_t id : generated) std::printf(" %d", id);
  std::printf("\n");
  const uint64_t rss = peak_rss_bytes();
  std::printf("PEAK RSS %s (quote this, not the plan)\n", human_bytes(static_cast<double>(rss)).c_str());

  RunReport r;
  r.prompt_ids = prompt;
  r.generated_ids = generated;
  r.full_ids = seq;
  r.layers = n_layers;
  r.threads = o.threads;
  r.incremental = o.incremental;
  r.seconds_per_token = spt;
  r.wall_seconds = now() - t_start;
  r.peak_rss_bytes = rss;
  r.threads =
      static_cast<int>(tbb::global_control::active_value(tbb::global_control::max_allowed_parallelism));
  if (stream) stream->finish(r, t_steps);
  const std::string out = o.out_path.value_or("k3_run.json");
  write_file_atomic(out, to_json(r));
  std::printf("wrote %s\n", out.c_str());
  return 0;
}

}  // namespace

Action add_generate(CLI::App& sub) {
  auto o = std::make_shared<GenerateOptions>();
  sub.add_option("MODEL_DIR", o->model_dir, "checkpoint directory (config.json + *.safetensors)")->required();
  sub.add_option("--ids", o->ids, "prompt as token ids: 1,2,3 (commas and/or spaces)");
  sub.add_option("--prompt", o->prompt, "prompt text (needs --tok)");
  sub.add_option("--prompt-file", o->prompt_file, "prompt text read verbatim from a file (needs --tok)");
  sub.add_option("--tok", o->tok, "tokenizer directory (tiktoken.model + tokenizer_config.json)");
  sub.add_option("--gen", o->gen, "tokens to generate (0..4096)")
      ->check(CLI::Range(0, kMaxGen))
      ->capture_default_str();
  sub.add_flag("--incremental", o->incremental, "carry the MLA KV cache and KDA state between tokens");
  sub.add_option("--layers", o->layers, "run only the first N layers (N <= 0 or >= n_layers: all)");
  sub.add_option("--out", o->out_path, "run report JSON (default k3_run.json)");
  sub.add_option("--dump-logits", o->dump_logits, "write step 0's last-position logits (vocab x float32)");
  sub.add_option("--save-state", o->save_state,
                 "write the carried state (K3ST) after the run (needs --incremental)");
  sub.add_option("--load-state", o->load_state,
                 "resume from a K3ST state; the ids continue it (needs --incremental)");
  sub.add_option("--config", o->config, "config.json to use (default MODEL_DIR/config.json)");
  sub.add_option("--threads", o->threads, "compute threads (0 = oneTBB default)")->check(CLI::Range(0, 4096));
  add_stream_flags(sub, o->stream);
  return [o] { return run_generate(*o); };
}

}  // namespace k3::pipeline
