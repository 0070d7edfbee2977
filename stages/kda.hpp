// KDA attention, one layer over T new tokens (docs/model.md §3.5). The input is already input-normed.
//
// Split for batched passes: the projections (q, k, v, g, b, f_a, f_b and o) are row-wise, so they
// run ONCE over all T rows of the pass (one kernels::matmul each: the weights stream from memory
// once, and each row's dot products are exactly those of a one-row matvec); only the ShortConv
// (its history is per sequence) and the recurrence (kda_recur, on the segment's own KdaState) run
// per segment.
#pragma once
#include <cstddef>
#include <span>

#include "io/config.hpp"
#include "stages/bind.hpp"

namespace k3::stages {

// What a speculative verify pass keeps of one KDA layer so that its rejected rows can be undone
// without reading a weight again (docs/speculative.md): the layer's state as the pass found it, and
// the recurrence's inputs of each row -- the raw ShortConv inputs of q, k, v, the post-conv q
// (scaled), k, v, the decay alpha ([rows][P] each) and beta ([rows][H]): capacity_rows x
// kda_journal_row_floats in `rows`, one block per quantity. kda_rollback replays them.
struct KdaJournal {
  std::span<float> before;  // kper floats: S then the conv histories, on entry to the pass
  std::span<float> rows;
  size_t capacity_rows = 0;
  size_t used_rows = 0;  // rows the pass recorded
};

// Carried per-layer state: S[h][i][j] (H*D*D, row = key channel) then the ShortConv histories of
// q, k, v, each [P][K-1] raw inputs, oldest first. Zero = fresh sequence. `journal`, when set, is
// filled by the next attention_kda over this state (one pass per journal).
struct KdaState {
  std::span<float> S;
  std::span<float> conv;
  KdaJournal* journal = nullptr;
};

size_t kda_state_floats(const io::ModelConfig&);  // H*D*D + 3*P*(K-1): the K3ST `kper`
KdaState kda_state_view(const io::ModelConfig&, std::span<float> layer_state);

size_t kda_journal_row_floats(const io::ModelConfig&);  // 7*P + H
// Sets the layer's state to what the journaled pass would have left after only its first
// `keep_rows` rows: the state before the pass, then those rows' ShortConv histories (data movement)
// and recurrence (kda_recur on the recorded inputs: the pass's own calls, so the same bits). No
// weights are read.
void kda_rollback(const io::ModelConfig&, KdaState, const KdaJournal&, size_t keep_rows);

// One sequence's rows [first_row, first_row + rows) of a pass over several, with its own state.
struct KdaSegment {
  KdaState state;
  size_t first_row = 0, rows = 0;
};

// The same for one segment or many: every buffer is per row of the pass.
size_t attention_kda_scratch(const io::ModelConfig&, size_t T);

// x, out: [T][hidden]. The recurrence runs t = 0..T-1 in order; state carries across calls.
void attention_kda(const KdaWeights&, const io::ModelConfig&, std::span<const float> x, size_t T,
                   KdaState state, std::span<float> out, std::span<float> scratch);
// Several sequences' rows in one pass (segments in row order, covering 0..T-1, distinct states):
// each segment's output rows and state are the bits attention_kda gives it alone.
void attention_kda(const KdaWeights&, const io::ModelConfig&, std::span<const float> x, size_t T,
                   std::span<const KdaSegment>, std::span<float> out, std::span<float> scratch);

// The recurrence of one sequence over `rows` consecutive tokens: per head, time in order (decay,
// read, delta write, output from the UPDATED state -- kernels::kda_step). alpha, k, v, q_scaled,
// o: [rows][H*D] (q and k already L2-normed, q scaled); beta: [rows][H]. S: the sequence's
// H*D*D state, updated in place.
void kda_recur(const io::ModelConfig&, std::span<float> S, std::span<const float> alpha,
               std::span<const float> k, std::span<const float> v, std::span<const float> beta,
               std::span<const float> q_scaled, std::span<float> o, size_t rows);

}  // namespace k3::stages
