#include "pipeline/run/batch_engine.hpp"

#include <fmt/format.h>

#include <cstdio>

#include "io/error.hpp"
#include "pipeline/run/run_report.hpp"
#include "pipeline/support/human_bytes.hpp"

namespace k3::pipeline {

namespace {

int checked_max_seqs(int n) {
  if (n < 1) throw io::usage_error(fmt::format("--max-seqs {}: needs at least 1 sequence", n));
  return n;
}

}  // namespace

BatchEngine::BatchEngine(const DecoderOptions& o, io::ModelConfig cfg, int max_seqs)
    : cfg_(std::move(cfg)),
      n_layers_(bound_layers(cfg_, o.layers)),
      capacity_(run_capacity(o)),
      shards_(open_model_shards(o.model_dir)) {
  const int n = checked_max_seqs(max_seqs);
  // A server runs until it is stopped: the graph may always read ahead into the next step.
  stream_ = StreamRun::open(o.stream, cfg_, shards_, n_layers_, capacity_, 1 << 30);
  if (!stream_) model_ = load_resident(shards_, cfg_, n_layers_, progress_mode(o.stream));
  states_.reserve(size_t(n));
  for (int i = 0; i < n; ++i)
    states_.push_back(std::make_unique<stages::DecodeState>(cfg_, n_layers_, capacity_));
  std::printf("peak RSS after loading weights: %s\n", human_bytes(double(peak_rss_bytes())).c_str());
  std::printf("state for %d sequences of %zu positions: %s\n", n, capacity_,
              human_bytes(double(state_bytes())).c_str());
}

BatchEngine::~BatchEngine() = default;

size_t BatchEngine::cached(int seq) const {
  return states_.at(size_t(seq))->cached;
}

uint64_t BatchEngine::state_bytes() const {
  uint64_t b = 0;
  for (const auto& s : states_) b += s->sizes().bytes();
  return b;
}

void BatchEngine::reset(int seq) {
  states_.at(size_t(seq))->reset();
}

void BatchEngine::step(std::span<const Row> rows) {
  std::vector<bool> seen(states_.size(), false);
  for (const Row& r : rows) {
    if (r.seq < 0 || size_t(r.seq) >= states_.size())
      throw io::runtime_error(
          fmt::format("batch step: sequence slot {} outside 0..{}", r.seq, states_.size() - 1));
    if (seen[size_t(r.seq)])
      throw io::runtime_error(fmt::format("batch step: sequence slot {} appears twice in one step", r.seq));
    seen[size_t(r.seq)] = true;
    if (r.logits.size() < size_t(cfg_.vocab))
      throw io::runtime_error(fmt::format("batch step: sequence {}: logits hold {} floats, the vocabulary {}",
                                          r.seq, r.logits.size(), cfg_.vocab));
    try {
      stages::check_forward_inputs(cfg_, *states_[size_t(r.seq)], r.ids);
    } catch (const io::Error& e) {
      throw io::Error(e.kind(), fmt::format("sequence {}: {}", r.seq, e.what()));
    }
  }
  // Until the graph and stages::forward take several sequences per pass, a step is one pass per
  // row: the same bits, each trunk layer read once per row instead of once per step.
  for (const Row& r : rows) {
    stages::DecodeState& st = *states_[size_t(r.seq)];
    const std::span<float> logits = r.logits.first(size_t(cfg_.vocab));
    if (stream_)
      stream_->forward(st, r.ids, logits);
    else
      stages::forward(*model_, st, r.ids, stages::HeadAt::last, logits, scratch_);
  }
  for (const Row& r : rows)
    check_logits_finite(cfg_, *states_[size_t(r.seq)], r.logits.first(size_t(cfg_.vocab)),
                        fmt::format("sequence {}: ", r.seq));
}

}  // namespace k3::pipeline
