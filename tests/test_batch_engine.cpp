// pipeline/run/batch_engine.*: several sequences in one engine, on fixtures/tiny-k3, resident and
// streamed at the floor. Sequences of different lengths join and leave between steps (a prompt fed
// whole in the step it joins, then one id per step, greedy), and every step's logits must be the
// bytes a Decoder produces for that sequence alone; bad rows are refused before any state changes.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "io/error.hpp"
#include "kernels/argmax.hpp"
#include "pipeline/run/batch_engine.hpp"
#include "pipeline/run/decoder.hpp"

using namespace k3;
using k3::pipeline::BatchEngine;
using k3::pipeline::Decoder;
using k3::pipeline::DecoderOptions;

namespace {

const std::string kTiny = std::string(K3_FIXTURES) + "/tiny-k3";

DecoderOptions options(bool streamed) {
  DecoderOptions o;
  o.model_dir = kTiny;
  o.capacity = 64;
  o.stream.no_progress = true;
  if (streamed) o.stream.preset = "ultra";  // the floor: every layer through the ring
  return o;
}

// A sequence alone: the logits of every step (prompt, then `gen` greedy ids), as bytes.
std::vector<std::string> solo(const io::ModelConfig& cfg, bool streamed, const std::vector<int32_t>& prompt,
                              int gen) {
  DecoderOptions o = options(streamed);
  o.expected_calls = gen + 1;
  Decoder d(o, cfg);
  d.push(prompt);
  std::vector<std::string> out;
  for (int i = 0; i <= gen; ++i) {
    std::span<const float> l = d.logits();
    out.emplace_back(reinterpret_cast<const char*>(l.data()), l.size_bytes());
    d.push(int32_t(kernels::argmax(l)));
  }
  return out;
}

struct Seq {
  std::vector<int32_t> prompt;
  int join = 0, gen = 0;  // the step it joins at; ids it generates after the prompt
  int slot = -1, done = 0;
  int32_t next = -1;
  std::vector<float> logits;
  std::vector<std::string> got;
};

void run_batched(bool streamed) {
  const io::ModelConfig cfg = pipeline::load_model_config(kTiny, std::nullopt);
  std::vector<Seq> seqs(4);
  seqs[0].prompt = {203, 34, 2, 239, 195}, seqs[0].join = 0, seqs[0].gen = 6;
  seqs[1].prompt = {71, 163}, seqs[1].join = 0, seqs[1].gen = 3;  // leaves early: the 4th reuses its slot
  seqs[2].prompt = {54, 121, 104, 16, 16, 219, 63}, seqs[2].join = 2, seqs[2].gen = 4;
  seqs[3].prompt = {4, 31, 48}, seqs[3].join = 5, seqs[3].gen = 3;
  BatchEngine eng(options(streamed), cfg, 3);
  REQUIRE(eng.max_seqs() == 3);
  std::vector<bool> busy(3, false);
  for (int step = 0; step < 12; ++step) {
    std::vector<BatchEngine::Row> rows;
    for (Seq& s : seqs) {
      if (s.join == step && s.slot < 0) {
        const auto free = std::find(busy.begin(), busy.end(), false);
        REQUIRE(free != busy.end());
        s.slot = int(free - busy.begin());
        busy[size_t(s.slot)] = true;
        eng.reset(s.slot);
        s.logits.resize(size_t(cfg.vocab));
      }
      if (s.slot < 0 || s.done > s.gen) continue;
      const std::span<const int32_t> ids =
          s.done == 0 ? std::span<const int32_t>(s.prompt) : std::span<const int32_t>(&s.next, 1);
      rows.push_back({s.slot, ids, s.logits});
    }
    if (rows.empty()) continue;
    eng.step(rows);
    for (Seq& s : seqs) {
      if (s.slot < 0 || s.done > s.gen) continue;
      s.got.emplace_back(reinterpret_cast<const char*>(s.logits.data()), s.logits.size() * 4);
      s.next = int32_t(kernels::argmax(s.logits));
      if (++s.done > s.gen) busy[size_t(s.slot)] = false;  // leaves: the slot is free next step
    }
  }
  for (const Seq& s : seqs) {
    CAPTURE(s.join);
    REQUIRE(s.done == s.gen + 1);
    const std::vector<std::string> want = solo(cfg, streamed, s.prompt, s.gen);
    REQUIRE(s.got.size() == want.size());
    for (size_t i = 0; i < want.size(); ++i) {
      CAPTURE(i);
      CHECK(s.got[i] == want[i]);
    }
  }
}

}  // namespace

TEST_CASE("batched sequences joining and leaving: every step's logits are the solo run's bytes (resident)") {
  run_batched(false);
}

TEST_CASE(
    "batched sequences joining and leaving: every step's logits are the solo run's bytes (streamed, floor)") {
  run_batched(true);
}

TEST_CASE("a bad row is refused, naming its slot, before any state changes") {
  const io::ModelConfig cfg = pipeline::load_model_config(kTiny, std::nullopt);
  BatchEngine eng(options(false), cfg, 2);
  std::vector<float> a(size_t(cfg.vocab)), b(size_t(cfg.vocab));
  const std::vector<int32_t> good = {1, 2, 3}, bad = {1, cfg.vocab};
  const std::vector<BatchEngine::Row> rows = {{0, good, a}, {1, bad, b}};
  CHECK_THROWS_WITH_AS(eng.step(rows), doctest::Contains("sequence 1"), io::Error);
  CHECK(eng.cached(0) == 0);
  const std::vector<BatchEngine::Row> twice = {{0, good, a}, {0, good, b}};
  CHECK_THROWS_WITH_AS(eng.step(twice), doctest::Contains("twice"), io::Error);
  const std::vector<BatchEngine::Row> outside = {{2, good, a}};
  CHECK_THROWS_WITH_AS(eng.step(outside), doctest::Contains("slot 2"), io::Error);
  CHECK_THROWS_AS(BatchEngine(options(false), cfg, 0), io::Error);
  eng.step(std::vector<BatchEngine::Row>{{0, good, a}});
  CHECK(eng.cached(0) == 3);
  CHECK(eng.cached(1) == 0);
}
