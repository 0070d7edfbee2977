#include "pipeline/run/batch_engine.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>

#include "io/error.hpp"
#include "pipeline/graph/planner.hpp"
#include "pipeline/run/run_report.hpp"
#include "pipeline/support/human_bytes.hpp"
#include "pipeline/support/process_memory.hpp"

namespace k3::pipeline {

namespace {

// Without a plan (resident) a pass is capped as a streamed one is: the planner's pass_rows.
size_t default_pass_rows(size_t capacity, size_t n_seqs) {
  return size_t(pass_rows(capacity, int(n_seqs)));
}

int checked_max_seqs(int n) {
  if (n < 1) throw io::usage_error(fmt::format("--max-seqs {}: needs at least 1 sequence", n));
  return n;
}

}  // namespace

PrefillPolicy::Mode parse_prefill_mode(const std::string& text, const char* flag) {
  if (text == "inline") return PrefillPolicy::Mode::inline_decode;
  if (text == "separate") return PrefillPolicy::Mode::separate;
  throw io::usage_error(fmt::format("{} '{}': inline or separate", flag, text));
}

const char* prefill_mode_name(PrefillPolicy::Mode m) {
  return m == PrefillPolicy::Mode::separate ? "separate" : "inline";
}

BatchEngine::BatchEngine(const DecoderOptions& o, io::ModelConfig cfg, int max_seqs)
    : cfg_(std::move(cfg)),
      n_layers_(bound_layers(cfg_, o.layers)),
      capacity_(run_capacity(o)),
      shards_(open_model_shards(o.model_dir)) {
  const int n = checked_max_seqs(max_seqs);
  // A server runs until it is stopped: the graph may always read ahead into the next step. The plan
  // holds every slot's state and a pass of max_step_rows() ids (its pass_rows).
  StreamFlags flags = o.stream;
  flags.max_seqs = n;
  stream_ = StreamRun::open(flags, cfg_, shards_, n_layers_, capacity_, 1 << 30, o.experts, o.ranks);
  // Every rank plans from the same flags, so every rank's pass_rows is rank 0's.
  max_rows_ = stream_ ? size_t(stream_->pass_rows()) : default_pass_rows(capacity_, size_t(n));
  if (!stream_) model_ = load_resident(shards_, cfg_, n_layers_, progress_mode(o.stream), o.experts);
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

void BatchEngine::set_max_step_rows(size_t n) {
  const size_t most = stream_ ? size_t(stream_->pass_rows()) : default_pass_rows(capacity_, states_.size());
  if (n < 1 || n > most)
    throw io::usage_error(
        fmt::format("batch: {} ids per pass: needs 1..{} (the plan's activations)", n, most));
  max_rows_ = n;
}

void BatchEngine::reset(int seq) {
  states_.at(size_t(seq))->reset();
}

uint64_t BatchEngine::snapshot_bytes(size_t positions) const {
  const stages::StateSizes& z = states_.front()->sizes();
  return z.kda_bytes() + uint64_t(positions) * z.kv_position_bytes();
}

BatchEngine::Snapshot BatchEngine::snapshot(int seq) {
  stages::DecodeState& st = *states_.at(size_t(seq));
  Snapshot s;
  s.positions = st.cached;
  s.kda.reserve(st.kda_bytes() / 4);
  for (int l = 0; l < st.n_bound(); ++l) {
    const std::span<const float> k = st.kda_layer(l);
    s.kda.insert(s.kda.end(), k.begin(), k.end());
  }
  s.kv.reserve(size_t(st.n_mla()) * s.positions * st.kvpp());
  s.rope.reserve(size_t(st.n_mla()) * s.positions * st.ropepp());
  for (int m = 0; m < st.n_mla(); ++m) {
    const std::span<const float> kv = st.kv_rows(m, s.positions), rope = st.rope_rows(m, s.positions);
    s.kv.insert(s.kv.end(), kv.begin(), kv.end());
    s.rope.insert(s.rope.end(), rope.begin(), rope.end());
  }
  return s;
}

void BatchEngine::restore(int seq, const Snapshot& s) {
  stages::DecodeState& st = *states_.at(size_t(seq));
  const size_t n_mla = size_t(st.n_mla());
  if (s.positions > st.capacity() || s.kda.size() * 4 != st.kda_bytes() ||
      s.kv.size() != n_mla * s.positions * st.kvpp() || s.rope.size() != n_mla * s.positions * st.ropepp())
    throw io::runtime_error(fmt::format(
        "batch: sequence {}: a snapshot of {} positions does not fit this engine's state (internal error)",
        seq, s.positions));
  st.reset();
  size_t at = 0;
  for (int l = 0; l < st.n_bound(); ++l) {
    const std::span<float> k = st.kda_layer(l);
    std::copy_n(s.kda.begin() + long(at), k.size(), k.begin());
    at += k.size();
  }
  for (int m = 0; m < st.n_mla(); ++m) {
    const std::span<float> kv = st.kv_rows(m, s.positions), rope = st.rope_rows(m, s.positions);
    std::copy_n(s.kv.begin() + long(size_t(m) * kv.size()), kv.size(), kv.begin());
    std::copy_n(s.rope.begin() + long(size_t(m) * rope.size()), rope.size(), rope.begin());
  }
  st.cached = s.positions;
}

std::vector<size_t> BatchEngine::plan_step(std::span<const Pending> seqs) const {
  const size_t chunk = prefill_.chunk ? prefill_.chunk : SIZE_MAX;
  const bool prompts_only =
      prefill_.mode == PrefillPolicy::Mode::separate &&
      std::any_of(seqs.begin(), seqs.end(), [](const Pending& p) { return p.prompt && p.ids > 0; });
  std::vector<size_t> feed(seqs.size(), 0);
  for (size_t i = 0; i < seqs.size(); ++i) {
    const Pending& p = seqs[i];
    if (p.prompt)
      feed[i] = std::min(p.ids, chunk);
    else if (!prompts_only)
      feed[i] = p.ids;
  }
  return feed;
}

void BatchEngine::check_rows(std::span<const Row> rows) const {
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
}

void BatchEngine::step(std::span<const Row> rows) {
  check_rows(rows);
  // One pass for every row, unless the rows' ids together exceed max_step_rows(): then passes
  // that each take the rows with the fewest ids left first and as many ids as fit.
  const size_t V = size_t(cfg_.vocab);
  std::vector<size_t> order(rows.size()), fed(rows.size(), 0);
  for (size_t i = 0; i < rows.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return rows[a].ids.size() < rows[b].ids.size(); });
  std::vector<stages::Segment> segs;
  std::vector<size_t> seg_row;
  passes_ = 0;
  for (bool more = true; more;) {
    segs.clear();
    seg_row.clear();
    pass_ids_.clear();
    for (size_t i : order) {
      const size_t left = rows[i].ids.size() - fed[i], room = max_rows_ - pass_ids_.size();
      if (left == 0 || room == 0) continue;
      const size_t n = std::min(left, room);
      segs.push_back({.state = states_[size_t(rows[i].seq)].get(), .first_row = pass_ids_.size(), .rows = n});
      seg_row.push_back(i);
      pass_ids_.insert(pass_ids_.end(), rows[i].ids.begin() + long(fed[i]),
                       rows[i].ids.begin() + long(fed[i] + n));
    }
    if (segs.empty()) break;
    pass_logits_.resize(segs.size() * V);
    if (stream_)
      stream_->forward_batch(segs, pass_ids_, pass_logits_);
    else
      stages::forward_batch(*model_, segs, pass_ids_, pass_logits_, scratch_);
    ++passes_;
    for (size_t s = 0; s < segs.size(); ++s) {
      const size_t i = seg_row[s];
      fed[i] += segs[s].rows;
      if (fed[i] == rows[i].ids.size())
        std::copy_n(pass_logits_.begin() + long(s * V), V, rows[i].logits.begin());
    }
    more = false;
    for (size_t i = 0; i < rows.size(); ++i) more = more || fed[i] < rows[i].ids.size();
    if (after_partial_)
      for (size_t s = 0; s < segs.size(); ++s)
        if (fed[seg_row[s]] < rows[seg_row[s]].ids.size()) after_partial_(rows[seg_row[s]].seq);
  }
  for (const Row& r : rows)
    check_logits_finite(cfg_, *states_[size_t(r.seq)], r.logits.first(size_t(cfg_.vocab)),
                        fmt::format("sequence {}: ", r.seq));
}

}  // namespace k3::pipeline
