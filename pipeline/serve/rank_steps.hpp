// `k3flow serve` over several ranks (mpirun, docs/distributed.md §6): rank 0 runs the HTTP server and
// the scheduler; every other rank holds its slice of the experts and runs the very steps rank 0 runs,
// which it learns from one message before each step: the slots reset since the last step (sequences
// that joined) and each row's slot and ids (what plan_step decided under the prefill policy, a
// prompt's chunk or the id rank 0 sampled last). The expert exchange inside the step then keeps every
// rank's hidden state equal to one process's, so rank 0 alone samples; the followers' logits go
// unused. A stop message ends the followers when rank 0's scheduler has drained.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "pipeline/ranks/comm.hpp"
#include "pipeline/run/batch_engine.hpp"

namespace k3::pipeline::serve {

struct StepOrder {
  bool stop = false;        // rank 0's server has drained: the followers return
  std::vector<int> resets;  // slots to zero before the step (in this order)
  struct Row {
    int seq = 0;
    std::vector<int32_t> ids;
  };
  std::vector<Row> rows;  // the step's rows, as rank 0 feeds them; empty: resets only
};

// The wire form: int32 words (stop flag, resets, rows with their ids). decode throws io::Error
// (runtime) naming what is malformed.
std::string encode_step(const StepOrder&);
StepOrder decode_step(std::string_view bytes);

// Rank 0: the order to every other rank (a collective: every follower is in receive_step).
void send_step(ranks::Comm&, const StepOrder&);
// A follower: the next order, waiting without a deadline (an idle server sends nothing).
StepOrder receive_step(ranks::Comm&);

// A follower's life after loading: receive each order and run it on `engine` (resets, then the
// step) until the stop order. A step whose logits are not finite (run_invalid) is the same on every
// rank -- rank 0 ends that step's requests and serves on -- so it is passed over here too; any other
// error is this rank's alone and is thrown (main then ends every rank's run, naming this rank).
void follow_steps(ranks::Comm&, BatchEngine& engine);

}  // namespace k3::pipeline::serve
