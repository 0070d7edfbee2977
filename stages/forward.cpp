#include "stages/forward.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "io/error.hpp"
#include "stages/attnres.hpp"
#include "stages/head.hpp"
#include "stages/kda.hpp"
#include "stages/mla.hpp"

namespace k3::stages {

StateSizes StateSizes::of(const io::ModelConfig& c, int n_bound, size_t capacity) {
  StateSizes s;
  s.n_bound = n_bound;
  for (int l = 0; l < n_bound; ++l) ++(c.is_mla(l) ? s.n_mla : s.n_kda);
  s.capacity = capacity;
  s.kper = kda_state_floats(c);
  s.kvpp = mla_kv_floats_per_position(c);
  s.ropepp = mla_rope_floats_per_position(c);
  return s;
}

void ForwardWatch::scan(int layer, std::span<const float> hidden, size_t E, size_t first_position) {
  // Non-finite exactly when the exponent bits are all ones; branch-free, so the loop vectorizes.
  uint32_t bad = 0;
  for (float v : hidden) {
    uint32_t b;
    std::memcpy(&b, &v, sizeof b);
    bad |= uint32_t((b & 0x7f800000u) == 0x7f800000u);
  }
  if (!bad) return;
  size_t i = 0;
  while (std::isfinite(hidden[i])) ++i;
  nonfinite_layer = layer;
  nonfinite_position = first_position + (E ? i / E : 0);
}

std::string describe_layer(const io::ModelConfig& c, int l) {
  if (l == ForwardWatch::kEmbedding) return "the embedding";
  return fmt::format("layer {} ({}, {})", l, c.is_mla(l) ? "MLA" : "KDA",
                     c.is_dense(l) ? "dense FFN" : "MoE");
}

DecodeState::DecodeState(const io::ModelConfig& c, int n_bound, size_t kv_capacity)
    : cfg_(&c),
      sizes_(StateSizes::of(c, n_bound, kv_capacity)),
      kda_ordinal_(n_bound, -1),
      mla_ordinal_(n_bound, -1) {
  for (int l = 0, k = 0, m = 0; l < n_bound; ++l) {
    if (c.is_mla(l))
      mla_ordinal_[l] = m++;
    else
      kda_ordinal_[l] = k++;
  }
  // Exactly the bytes StateSizes counts (what the planner plans), touched now rather than mid-run.
  kda_.assign(sizes_.kda_bytes() / 4, 0.0f);
  kv_.assign(sizes_.capacity * sizes_.kvpp * size_t(sizes_.n_mla), 0.0f);
  rope_.assign(sizes_.capacity * sizes_.ropepp * size_t(sizes_.n_mla), 0.0f);
}

void DecodeState::reset() {
  std::fill(kda_.begin(), kda_.end(), 0.0f);
  watch.clear();
  cached = 0;  // cache rows past `cached` are never read, so they need no clearing
  journaling_ = false;
}

uint64_t DecodeState::journal_bytes(size_t rows) const {
  return 4 * uint64_t(sizes_.n_kda) * (uint64_t(kper()) + uint64_t(rows) * kda_journal_row_floats(*cfg_));
}

void DecodeState::begin_journal(size_t rows) {
  const size_t rf = kda_journal_row_floats(*cfg_), per = kper() + rows * rf;
  const size_t n = size_t(sizes_.n_kda);
  if (journals_.size() != n || journals_.empty() || journals_[0].capacity_rows < rows) {
    journal_mem_.assign(n * per, 0.0f);
    journals_.assign(n, KdaJournal{});
    for (size_t k = 0; k < n; ++k) {
      std::span<float> m = std::span(journal_mem_).subspan(k * per, per);
      journals_[k] = KdaJournal{
          .before = m.first(kper()), .rows = m.subspan(kper()), .capacity_rows = rows, .used_rows = 0};
    }
  }
  for (KdaJournal& j : journals_) j.used_rows = 0;
  journaling_ = true;
  journal_start_ = cached;
}

void DecodeState::keep(size_t rows) {
  if (!journaling_ || cached < journal_start_ || rows > cached - journal_start_)
    throw io::runtime_error(
        fmt::format("DecodeState::keep({}): no journaled pass covers those rows (internal error)", rows));
  const size_t fed = cached - journal_start_;
  if (rows < fed)
    for (int l = 0; l < n_bound(); ++l) {
      const int k = kda_ordinal_[size_t(l)];
      if (k >= 0) kda_rollback(*cfg_, kda_state_view(*cfg_, kda_layer(l)), journals_[size_t(k)], rows);
    }
  cached = journal_start_ + rows;  // MLA rows past it are never read again, only overwritten
  if (watch.nonfinite_layer != ForwardWatch::kNone && watch.nonfinite_position >= cached) watch.clear();
  journaling_ = false;
}

std::span<float> DecodeState::kda_layer(int l) {
  const int k = kda_ordinal_.at(size_t(l));
  return k < 0 ? std::span<float>() : std::span(kda_).subspan(size_t(k) * kper(), kper());
}

LayerState DecodeState::layer(int l) {
  LayerState s;
  s.cached = cached;
  if (kda_ordinal_[l] >= 0) {
    s.kda = kda_state_view(*cfg_, kda_layer(l));
    if (journaling_) s.kda.journal = &journals_[size_t(kda_ordinal_[l])];
  }
  if (mla_ordinal_[l] >= 0) {
    const size_t m = static_cast<size_t>(mla_ordinal_[l]), cap = capacity();
    s.mla = {std::span(kv_).subspan(m * cap * kvpp(), cap * kvpp()),
             std::span(rope_).subspan(m * cap * ropepp(), cap * ropepp()), cap};
  }
  return s;
}

void check_forward_inputs(const io::ModelConfig& c, const DecodeState& st, std::span<const int32_t> ids) {
  if (ids.empty()) throw io::runtime_error("forward: no tokens to feed");
  for (int32_t id : ids)
    if (id < 0 || id >= c.vocab)
      throw io::runtime_error(fmt::format("forward: token id {} outside 0..{}", id, c.vocab - 1));
  if (st.cached + ids.size() > st.capacity())
    throw io::runtime_error(fmt::format("MLA KV cache overflow: {} positions needed, capacity {}",
                                        st.cached + ids.size(), st.capacity()));
}

void check_segments(const io::ModelConfig& c, std::span<const Segment> segs, std::span<const int32_t> ids) {
  if (segs.empty()) throw io::runtime_error("forward: no sequences to feed");
  size_t row = 0;
  for (size_t i = 0; i < segs.size(); ++i) {
    const Segment& s = segs[i];
    if (!s.state || s.first_row != row || s.rows == 0 || s.first_row + s.rows > ids.size())
      throw io::runtime_error(fmt::format(
          "forward: segment {} (rows {}..+{}) does not follow the previous one in {} ids (internal error)", i,
          s.first_row, s.rows, ids.size()));
    for (size_t j = 0; j < i; ++j)
      if (segs[j].state == s.state)
        throw io::runtime_error(fmt::format("forward: segments {} and {} feed the same state", j, i));
    try {
      check_forward_inputs(c, *s.state, ids.subspan(s.first_row, s.rows));
    } catch (const io::Error& e) {
      throw io::Error(e.kind(), fmt::format("segment {}: {}", i, e.what()));
    }
    row += s.rows;
  }
  if (row != ids.size())
    throw io::runtime_error(
        fmt::format("forward: segments cover {} of {} ids (internal error)", row, ids.size()));
}

std::vector<LayerSegment> layer_segments(std::span<const Segment> segs, int layer) {
  std::vector<LayerSegment> out;
  out.reserve(segs.size());
  for (const Segment& s : segs)
    out.push_back(LayerSegment{.state = s.state->layer(layer), .first_row = s.first_row, .rows = s.rows});
  return out;
}

namespace {

// The pass both entry points share. HeadAt::all (one segment only) gives every row's logits.
void forward_segments(const WeightSource& ws, std::span<const Segment> segs, std::span<const int32_t> ids,
                      HeadAt head_at, std::span<float> logits, Scratch& scratch) {
  const io::ModelConfig& c = ws.config();
  const size_t T = ids.size(), E = static_cast<size_t>(c.hidden), V = static_cast<size_t>(c.vocab);
  check_segments(c, segs, ids);

  const size_t maxb = static_cast<size_t>(c.max_blocks());
  const bool all = head_at == HeadAt::all;
  const size_t n_out = all ? T : segs.size();
  // The scratch of the largest layer: every layer kind at every segment's current position.
  std::vector<LayerSegment> ls(segs.size());
  for (size_t i = 0; i < segs.size(); ++i) {
    ls[i].state.cached = segs[i].state->cached;
    ls[i].rows = segs[i].rows;
  }
  const size_t layer_sc = decoder_layer_scratch(c, ls);
  const size_t total = T * E + maxb * T * E + std::max(layer_sc, 2 * n_out * E + attnres_scratch(c, maxb));
  Carver cut(scratch.get(total));
  std::span<float> P = cut.take(T * E), blocks_mem = cut.take(maxb * T * E);
  std::span<float> rest = cut.take(total - T * E - maxb * T * E);

  embed_tokens(ws.head(), c, ids, P);
  for (const Segment& s : segs)
    s.state->watch.after_layer(ForwardWatch::kEmbedding, P.subspan(s.first_row * E, s.rows * E), E,
                               s.state->cached);
  BlockStack B(blocks_mem, maxb, T, E);  // per call: the stack is per token, never carried
  const int n = ws.bound_layers();
  for (int l = 0; l < n; ++l) {
    const ExpertFn expert = [&ws, l](int e) -> const ExpertWeights& { return ws.expert(l, e); };
    ls = layer_segments(segs, l);
    decoder_layer(ws.layer(l), expert, c, P, T, B, ls, rest);
    for (const Segment& s : segs) {
      s.state->watch.after_layer(l, P.subspan(s.first_row * E, s.rows * E), E, s.state->cached);
      if (s.state->watch.on_layer) s.state->watch.on_layer(l + 1, n, 0, 0);
    }
  }

  // Model-level aggregation, then the head, only where logits are wanted (row by row: AttnRes is
  // per token, lm_head's matmul bit-identical per row).
  Carver tail(rest);
  std::span<float> h = tail.take(n_out * E), head_sc = tail.take(n_out * E),
                   agg_sc = tail.take(attnres_scratch(c, maxb));
  const HeadWeights& hw = ws.head();
  if (all) {
    attnres_stage(B, P, hw.out_res_norm, hw.out_res_proj, c, 0, T, h, agg_sc);
  } else {
    for (size_t i = 0; i < segs.size(); ++i) {
      const size_t t = segs[i].first_row + segs[i].rows - 1;
      attnres_stage(B, P, hw.out_res_norm, hw.out_res_proj, c, t, t + 1, h.subspan(i * E, E), agg_sc);
    }
  }
  lm_head(hw, c, h, n_out, logits.first(n_out * V), head_sc);
  for (const Segment& s : segs) s.state->cached += s.rows;
}

}  // namespace

void forward(const WeightSource& ws, DecodeState& st, std::span<const int32_t> ids, HeadAt head_at,
             std::span<float> logits, Scratch& scratch) {
  check_forward_inputs(ws.config(), st, ids);
  const Segment one{.state = &st, .first_row = 0, .rows = ids.size()};
  forward_segments(ws, std::span(&one, 1), ids, head_at, logits, scratch);
}

void forward_batch(const WeightSource& ws, std::span<const Segment> segs, std::span<const int32_t> ids,
                   std::span<float> logits, Scratch& scratch) {
  forward_segments(ws, segs, ids, HeadAt::last, logits, scratch);
}

}  // namespace k3::stages
