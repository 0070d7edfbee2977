#include "pipeline/decoder.hpp"

#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <cstdio>

#include "io/error.hpp"
#include "pipeline/human_bytes.hpp"
#include "pipeline/run_report.hpp"
#include "stages/head.hpp"

namespace k3::pipeline {

namespace {

double now() {
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}

int bound_layers(const io::ModelConfig& cfg, int layers) {
  return (layers <= 0 || layers >= cfg.n_layers) ? cfg.n_layers : layers;
}

io::ShardSet open_shards(const std::string& dir) {
  const double t0 = now();
  io::ShardSet s = io::ShardSet::open(dir);
  std::printf("indexed %zu tensors from %zu shards in %.2f s\n", s.tensor_count(), s.shard_count(),
              now() - t0);
  return s;
}

}  // namespace

io::ModelConfig load_model_config(const std::string& model_dir, const std::optional<std::string>& config) {
  const std::filesystem::path path =
      config ? std::filesystem::path(*config) : std::filesystem::path(model_dir) / "config.json";
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

Decoder::Decoder(const DecoderOptions& o, io::ModelConfig cfg)
    : cfg_(std::move(cfg)),
      n_layers_(bound_layers(cfg_, o.layers)),
      recompute_(o.recompute),
      shards_(open_shards(o.model_dir)),
      stream_(StreamRun::open(o.stream, cfg_, shards_, n_layers_, o.capacity, o.expected_calls)),
      state_(cfg_, n_layers_, o.capacity),
      logits_(size_t(cfg_.vocab)) {
  if (!stream_) {
    const double t0 = now();
    model_ = stages::ResidentModel::load(shards_, cfg_, n_layers_);
    std::printf("resident weights: %s bound for %d layers in %.2f s\n",
                human_bytes(double(model_->weight_bytes())).c_str(), n_layers_, now() - t0);
  }
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
  if (stream_)
    stream_->forward(state_, feed, logits_);
  else
    stages::forward(*model_, state_, feed, stages::HeadAt::last, logits_, scratch_);
  // A NaN weight or state still "decodes" (greedy picks id 0 forever): such a run is invalid.
  for (size_t i = 0; i < logits_.size(); ++i)
    if (!std::isfinite(logits_[i]))
      throw io::Error(io::ErrorKind::run_invalid,
                      fmt::format("the logits at position {} are not finite (logit {} is {}): a weight or the "
                                  "carried state holds NaN or inf; the run is invalid",
                                  state_.cached - 1, i, logits_[i]));
  return logits_;
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
