// `k3flow bench MODEL --batch 1,2,4,8 …`: B sequences decoding together through one BatchEngine
// (pipeline/run/batch_engine.hpp), a step being one pass over the trunk for all of them. For every B
// a child process (the same executable, `bench MODEL --batch-child B …`, so each run's memory and
// page cache are its own and its peak RSS comes from wait4) prefills B prompts of the same length
// in one step -- sequence q's prompt is the bench prompt with q * 31 added to every id (mod the
// vocabulary), so the sequences route to different experts -- then decodes greedily for --gen - 1
// steps. Rounds alternate every B (--repeat), with the page cache of the model (and trunk) dropped
// before each run.
//
// Reported per B: s per decode step (median and min over repeats), aggregate tokens/s (B / s per
// step), per-sequence s/token (= s per step), trunk and expert bytes read per decode step, peak RSS
// against the budget, and aggregate speedup over the smallest B. Every sequence q must emit the
// same ids for every B it runs in (a step's logits do not depend on the other rows): the bench
// refuses a run that does not.
//
// `k3flow bench MODEL --batch B --join N [--prefill inline,separate] [--prefill-chunk C]`: the cost
// of a prompt joining a running batch. B - 1 sequences prefill and decode kWarmSteps steps, then a
// sequence with an N-id prompt joins and decodes until it has --gen tokens; one child per prefill
// mode and repeat (page cache dropped before each). Reported per mode: the joiner's time to first
// token, the running sequences' per-token latency before the join and their longest gap between two
// tokens from the join on (the stall), aggregate tokens/s from the join to the end, bytes read in
// that window. Every sequence must emit the same ids in every mode.
#pragma once
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "pipeline/run/batch_engine.hpp"

namespace k3::pipeline {

struct BatchBenchArgs {
  std::string model_dir, trunk_dir, preset, strategy = "auto";
  std::optional<double> mem_gb;
  std::vector<int32_t> ids;  // the prompt (sequence 0's)
  int gen = 8, repeat = 3, threads = 0;
  // The join bench: the joiner's prompt length (0: the plain --batch bench), the modes to compare,
  // and --prefill-chunk.
  size_t join = 0;
  std::vector<PrefillPolicy::Mode> modes;
  size_t chunk = 0;
  // --trace-dir DIR: every child writes DIR/batch-b<B>-r<repeat>.json (the plain --batch bench);
  // `trace`: this child's file.
  std::string trace_dir, trace;
};

// Decode steps the running sequences take before the joiner arrives.
inline constexpr int kWarmSteps = 3;

// The child: one BatchEngine with B sequences; prints what the engine prints, then one line
// "BATCH {json}" with the measurements and every sequence's ids.
int run_batch_child(const BatchBenchArgs&, int batch);

// The parent: every B in `batches` (ascending, distinct), `repeat` rounds; the table to `txt` and,
// when `json` is given, the same results as one JSON object into it (docs/performance.md lists the
// keys). Throws runtime Error when a child fails or a sequence's ids differ between batch sizes.
int run_batch_bench(const BatchBenchArgs&, const std::vector<int>& batches, std::FILE* txt,
                    std::string* json = nullptr);

// The join bench's child: B - 1 running sequences and one joiner under `mode`; prints one line
// "JOIN {key=value ...}" with the measurements and every sequence's ids.
int run_join_child(const BatchBenchArgs&, int batch, PrefillPolicy::Mode mode);

// The join bench's parent: `repeat` rounds of every mode in a.modes, the table to `txt` and, when
// `json` is given, the results as one JSON object. Throws runtime Error when a child fails or a
// sequence's ids differ between modes.
int run_join_bench(const BatchBenchArgs&, int batch, std::FILE* txt, std::string* json = nullptr);

// "inline,separate" -> the modes, in order; usage Error naming --prefill for anything else.
std::vector<PrefillPolicy::Mode> parse_prefill_modes(const std::string& text);

// "1,2,4,8" -> {1, 2, 4, 8}; usage Error (naming --batch) for anything else.
std::vector<int> parse_batch_list(const std::string& text);

}  // namespace k3::pipeline
