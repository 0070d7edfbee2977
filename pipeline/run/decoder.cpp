#include "pipeline/run/decoder.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <optional>

#include "io/error.hpp"
#include "pipeline/run/run_report.hpp"
#include "pipeline/support/clock.hpp"
#include "pipeline/support/human_bytes.hpp"
#include "pipeline/support/process_memory.hpp"
#include "stages/head.hpp"
#include "stages/moe.hpp"
#include "stages/tensors.hpp"

namespace k3::pipeline {

int bound_layers(const io::ModelConfig& cfg, int layers) {
  return (layers <= 0 || layers >= cfg.n_layers) ? cfg.n_layers : layers;
}

// Also where a Decoder refuses its flags, before the shards are indexed.
size_t run_capacity(const DecoderOptions& o) {
  check_stream_flags(o.stream);
  if (o.stream.context == 0) return o.capacity;
  if (o.stream.context < o.capacity)
    throw io::usage_error(
        fmt::format("--context {} holds fewer positions than this run needs: {} (saved + prompt + --gen + 1)",
                    o.stream.context, o.capacity));
  return size_t(o.stream.context);
}

Progress::Mode progress_mode(const StreamFlags& f) {
  return f.progress      ? Progress::Mode::always
         : f.no_progress ? Progress::Mode::never
                         : Progress::Mode::automatic;
}

namespace {

// The bytes ResidentModel::load reads: the head's, every bound layer's and its experts' buffers.
uint64_t resident_bytes(const io::ShardSet& shards, const io::ModelConfig& c, int n,
                        const stages::ExpertExchange* experts) {
  uint64_t b = stages::locate(stages::model_tensors(c), shards, c).buffer_bytes;
  for (int l = 0; l < n; ++l) {
    b += stages::locate(stages::layer_tensors(c, l).tensors, shards, c).buffer_bytes;
    if (!c.is_dense(l))
      for (int e = 0; e < c.n_experts; ++e)
        if (!experts || experts->owns(e)) b += stages::locate_expert(shards, c, l, e).buffer_bytes;
  }
  return b;
}

}  // namespace

io::ShardSet open_model_shards(const std::string& dir) {
  const double t0 = now_seconds();
  io::ShardSet s = io::ShardSet::open(dir);
  std::printf("indexed %zu tensors from %zu shards in %.2f s\n", s.tensor_count(), s.shard_count(),
              now_seconds() - t0);
  return s;
}

std::unique_ptr<stages::ResidentModel> load_resident(const io::ShardSet& shards, const io::ModelConfig& cfg,
                                                     int n_layers, Progress::Mode mode,
                                                     stages::ExpertExchange* experts) {
  const double t0 = now_seconds();
  ReadProgress bar("load", mode);
  if (bar.enabled()) bar.start(resident_bytes(shards, cfg, n_layers, experts));
  std::unique_ptr<stages::ResidentModel> model = stages::ResidentModel::load(shards, cfg, n_layers, experts);
  bar.done();
  std::printf("resident weights: %s bound for %d layers in %.2f s\n",
              human_bytes(double(model->weight_bytes())).c_str(), n_layers, now_seconds() - t0);
  return model;
}

io::ModelConfig load_model_config(const std::string& model_dir, const std::optional<std::string>& config) {
  const std::filesystem::path path =
      config ? std::filesystem::path(*config) : std::filesystem::path(model_dir) / "config.json";
  if (!std::filesystem::exists(path))
    throw io::usage_error(fmt::format("no model config at {} (pass --config PATH)", path.string()));
  // A config that exists but cannot be trusted is io/config.cpp's one-line runtime error (exit 1),
  // as in every other command: never a fallback to constants.
  return io::load_config(path);
}

Decoder::Decoder(const DecoderOptions& o, io::ModelConfig cfg)
    : cfg_(std::move(cfg)),
      n_layers_(bound_layers(cfg_, o.layers)),
      recompute_(o.recompute),
      progress_(progress_mode(o.stream)),
      capacity_(run_capacity(o)),
      shards_(open_model_shards(o.model_dir)),
      stream_(StreamRun::open(o.stream, cfg_, shards_, n_layers_, capacity_, o.expected_calls, o.experts,
                              o.ranks)),
      state_(cfg_, n_layers_, capacity_),
      logits_(size_t(cfg_.vocab)) {
  if (!stream_) model_ = load_resident(shards_, cfg_, n_layers_, progress_, o.experts);
  std::printf("peak RSS after loading weights: %s\n", human_bytes(double(peak_rss_bytes())).c_str());
  std::printf(
      "recurrent state for %d layers: %s; KV cache %s for %d MLA layers at %zu positions\n", n_layers_,
      human_bytes(double(state_.kda_bytes())).c_str(),
      human_bytes(double(state_.capacity()) * double(state_.kvpp() + state_.ropepp()) * state_.n_mla() * 4)
          .c_str(),
      state_.n_mla(), state_.capacity());
}

Decoder::~Decoder() = default;

void Decoder::push(std::span<const int32_t> ids) {
  seq_.insert(seq_.end(), ids.begin(), ids.end());
}

std::span<const float> Decoder::logits() {
  std::span<const int32_t> feed;
  if (recompute_) {
    state_.reset();  // full recompute: KDA state zeroed, the whole sequence every call
    feed = seq_;
  } else {
    feed = std::span<const int32_t>(seq_).subspan(state_.cached);
  }
  if (feed.empty()) throw io::usage_error("nothing to feed: the sequence has no pending token");
  {
    // The first step can take minutes at real scale (every layer read, pins loaded): a bar of
    // layers done, and of the pinned trunk bytes loaded in a streamed run.
    std::optional<Progress> bar;
    if (first_step_ && progress_ != Progress::Mode::never) {
      bar.emplace("first step", progress_);
      bar->set_unit("layers");
      if (bar->enabled())
        state_.watch.on_layer = [&bar](int done, int total, uint64_t pinned, uint64_t pinned_total) {
          if (pinned_total)
            bar->set_note(fmt::format("; pinned {} / {}", human_bytes(double(pinned)),
                                      human_bytes(double(pinned_total))));
          bar->update(uint64_t(done), uint64_t(total));
        };
    }
    struct Unhook {
      stages::ForwardWatch& w;
      ~Unhook() { w.on_layer = nullptr; }
    } unhook{state_.watch};
    first_step_ = false;
    if (stream_) {
      // Passes of at most the plan's rows (its activations are sized for them): a longer prefill is
      // fed in pieces, which gives the bits it gives fed whole. The whole feed is checked first, so
      // a bad id or a full cache still leaves the state as it was.
      stages::check_forward_inputs(cfg_, state_, feed);
      const size_t most = stream_->pass_rows() ? size_t(stream_->pass_rows()) : feed.size();
      for (size_t at = 0; at < feed.size(); at += most)
        stream_->forward(state_, feed.subspan(at, std::min(most, feed.size() - at)), logits_);
    } else {
      stages::forward(*model_, state_, feed, stages::HeadAt::last, logits_, scratch_);
    }
  }
  const std::span<const float> out = std::span<const float>(logits_).first(size_t(cfg_.vocab));
  check_logits_finite(cfg_, state_, out, "");
  return out;
}

std::span<const float> Decoder::verify(std::span<const int32_t> drafts) {
  if (recompute_ || pending() != 1 || drafts.empty())
    throw io::runtime_error("verify: needs one pending id, drafts and an incremental run (internal error)");
  first_step_ = false;
  const size_t base = state_.cached, rows = 1 + drafts.size();
  push(drafts);
  const std::span<const int32_t> feed = std::span<const int32_t>(seq_).subspan(base);
  if (logits_.size() < rows * size_t(cfg_.vocab)) logits_.resize(rows * size_t(cfg_.vocab));
  const std::span<float> out = std::span<float>(logits_).first(rows * size_t(cfg_.vocab));
  state_.begin_journal(rows);
  try {
    if (stream_)
      stream_->forward(state_, feed, out, stages::HeadAt::all);
    else
      stages::forward(*model_, state_, feed, stages::HeadAt::all, out, scratch_);
  } catch (...) {
    // Refused inputs leave the state as it was; a pass that failed later ends the run anyway.
    seq_.resize(base + 1);
    if (state_.cached == base + rows)
      state_.keep(1);
    else if (state_.journaling())
      state_.keep(0);
    throw;
  }
  check_logits_finite(cfg_, state_, out, "");
  return out;
}

void Decoder::keep(size_t rows) {
  state_.keep(rows);
  seq_.resize(state_.cached);
}

void check_logits_finite(const io::ModelConfig& cfg, const stages::DecodeState& st,
                         std::span<const float> logits, const std::string& whose) {
  // A NaN weight or state still "decodes" (greedy picks id 0 forever): such a run is invalid.
  for (size_t i = 0; i < logits.size(); ++i)
    if (!std::isfinite(logits[i])) {
      const stages::ForwardWatch& w = st.watch;
      const std::string where =
          w.nonfinite_layer == stages::ForwardWatch::kNone
              ? std::string("every layer's output was finite: the head (final norm, lm_head) made them")
              : fmt::format(
                    "the output of {} went non-finite first, at position {}: its weights or carried "
                    "state hold NaN or inf",
                    stages::describe_layer(cfg, w.nonfinite_layer), w.nonfinite_position);
      throw io::Error(
          io::ErrorKind::run_invalid,
          fmt::format("{}the logits at position {} are not finite (logit {} is {}): {}; the run is invalid",
                      whose, st.cached - 1, i, logits[i], where));
    }
}

void Decoder::reset() {
  state_.reset();
  seq_.clear();
}

uint64_t Decoder::save(const std::filesystem::path& path) {
  return save_state(path, cfg_, seq_, state_);
}

void Decoder::load(const std::filesystem::path& path) {
  state_.reset();
  seq_.clear();
  load_state(path, cfg_, state_, seq_);
}

}  // namespace k3::pipeline
