// `k3flow serve`'s scheduler: one thread owns the BatchEngine and runs continuous batching. At each
// step boundary it admits queued requests into free sequence slots (up to --max-seqs; a slot is
// reset before a new sequence uses it), feeds the active sequences in one BatchEngine::step (a
// joining prompt, the others the id they sampled last; which of them share a step is the engine's
// plan_step() under --prefill / --prefill-chunk), samples each row whose ids are all fed with that
// request's own stages::Sampler, decodes the text incrementally (io/text/text_stream.hpp; chat replies
// through io/text/xtml.hpp's ReplyParser, whose completed tool calls ride in the deltas) and hands the
// deltas to the request's Channel. A sequence leaves as
// soon as it is done (an end id or stop string, max_tokens, a full context, or its client gone); the others
// never wait for it.
//
// With a prompt cache (SchedulerOptions::prompt_cache_bytes, pipeline/serve/prompt_cache.hpp) an
// admitted request resumes from the longest held snapshot of its prompt's prefix and feeds only the
// rest; snapshots are taken inside prompts (pass and chunk boundaries where the positions doubled),
// at each prompt's end and when a reply ends. Outcome::cached_tokens says how many ids it skipped.
//
// Exactness: a request's ids are those `k3flow generate` produces for the same prompt and sampling
// options, whatever else shares its steps: BatchEngine gives each row the solo run's logits bytes,
// and the sampler sees the same logits and the same context (prompt + generated). A restored prefix
// is the state those ids leave, and feeding the rest after it is a chunked prefill (the same bits).
//
// The engine is opened on the scheduler thread, so the server can listen (and answer /health) while
// the weights load. Nothing here knows HTTP: tests drive it directly.
//
// Several ranks (mpirun, docs/distributed.md §6): this is rank 0's scheduler. It loads its slice
// together with the other ranks (one that cannot fails the load on every rank, naming itself), and
// before every step sends them what the step feeds (pipeline/serve/rank_steps.hpp); after draining,
// the stop order. A step that fails on this rank alone (not a check every rank makes the same) leaves
// the others inside the step: the scheduler then fails (phase failed) and the command ends the run.
#pragma once
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "io/config.hpp"
#include "io/error.hpp"
#include "io/text/tokenizer.hpp"
#include "pipeline/ranks/comm.hpp"
#include "pipeline/run/batch_engine.hpp"
#include "pipeline/run/decoder.hpp"
#include "pipeline/serve/channel.hpp"
#include "pipeline/serve/prompt_cache.hpp"
#include "stages/json_constraint.hpp"
#include "stages/sampler.hpp"

namespace k3::pipeline::serve {

struct GenRequest {
  std::vector<int32_t> prompt;  // ids, at least one
  stages::SamplerOptions sampling;
  int max_tokens = 16;
  std::vector<std::string> stop;  // stop strings (on the generated text)
  bool ignore_eos = false;
  // Chat: the generated text is an assistant message in K3's XTML format, parsed by ReplyParser;
  // deltas carry the reply channel as text and the think channel as reasoning.
  bool chat = false;
  bool thinking = true;
  // >= 0: every delta carries each token's logprob and this many most likely alternatives.
  int logprobs = -1;
  // Set: the output is constrained to JSON matching this schema (a chat reply's closing markers
  // follow it as the constraint's epilogue).
  std::shared_ptr<const stages::JsonSchema> json;
  // Chat: text the prompt already holds past the generation prompt (a forced tool call's opening),
  // fed to the reply parser before the generated text. Not counted as generated.
  std::string reply_prefix;
  // Chat: stop once this many tool calls are complete (0: no limit).
  int max_calls = 0;
};

struct SchedulerOptions {
  DecoderOptions dec;  // the model, budget flags, and dec.capacity: the positions per sequence
  int max_seqs = 4;
  int queue = 16;         // requests waiting for a slot; more are refused (HTTP 429)
  PrefillPolicy prefill;  // how a joining prompt shares steps with the decoding sequences
  // Bytes of prompt-prefix snapshots kept (pipeline/serve/prompt_cache.hpp); 0: no prompt cache.
  // One process only: over several ranks each rank's state would have to be restored alike.
  uint64_t prompt_cache_bytes = 0;
  // Rank 0 of several (dec.experts / dec.ranks set for its slice): the other ranks follow its steps
  // (serve::follow_steps). Null: one process.
  ranks::Comm* ranks = nullptr;
};

enum class Phase { loading, ready, failed, stopped };
const char* phase_name(Phase);

// What /health and /metrics read; every field is written by the scheduler thread only.
struct Gauges {
  std::atomic<uint64_t> requests_done{0}, prompt_tokens{0}, completion_tokens{0}, decode_steps{0},
      step_micros{0}, stream_bytes{0};
  // A streamed model's reads after the last step (StreamRun::totals()); 0 when resident.
  std::atomic<uint64_t> trunk_bytes{0}, expert_bytes{0}, expert_requests{0}, expert_hits{0},
      io_busy_micros{0}, compute_busy_micros{0};
  std::atomic<int> queued{0}, active{0};
  std::atomic<uint64_t> load_bytes_read{0}, load_bytes_total{0};  // while loading
  // The prompt cache (PromptCache::Stats, its held bytes and snapshots); all 0 when it is off.
  std::atomic<uint64_t> cache_hits{0}, cache_misses{0}, cache_hit_tokens{0}, cache_inserts{0},
      cache_evictions{0}, cache_bytes{0}, cache_entries{0};
};

class Scheduler {
 public:
  // Starts the scheduler thread, which opens the engine (phase loading, then ready or failed).
  Scheduler(SchedulerOptions, io::ModelConfig, const io::text::Tokenizer&);
  ~Scheduler();  // stop(0) and join
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  enum class Submit { queued, queue_full, not_ready, stopping };
  // Never blocks on the engine. `ch` receives the deltas and the outcome when queued.
  Submit submit(GenRequest, std::shared_ptr<Channel> ch);

  Phase phase() const { return phase_; }
  // Phase failed: the error that ended loading (kind and message as the engine threw it), or, over
  // several ranks, the step that failed on this rank alone.
  std::optional<io::Error> failure() const;
  // The failure is every rank's (a rank could not load its slice: ranks::CollectiveError).
  bool failure_collective() const;
  bool wait_until_settled(std::chrono::milliseconds bound);  // ready / failed / stopped within bound
  size_t capacity() const { return capacity_; }              // positions per sequence
  int max_seqs() const { return opt_.max_seqs; }
  uint64_t prompt_cache_budget() const { return opt_.prompt_cache_bytes; }
  const Gauges& gauges() const { return g_; }
  bool streamed() const { return streamed_; }

  // Stops admitting (submit says stopping); queued and active requests run on until `bound`
  // passes, then are cancelled. Returns once the scheduler thread is idle and gone.
  void stop(std::chrono::milliseconds bound);

 private:
  struct Active;
  void run();
  void loop();
  void admit();
  void decode_step();
  void finish(Active&, Finish, std::string error = {});
  // Every queued request (m_ held) / every active sequence (the scheduler thread) ended with `f`.
  void end_queued(Finish f, const std::string& error);
  void end_active(Finish f, const std::string& error);
  void fail_ranks(const std::string& error);
  // Prompt cache: a snapshot of slot `a.slot` after the ids it has been fed, when worth holding.
  // `boundary`: a pass or chunk boundary inside the prompt (taken only where positions doubled).
  void remember(Active& a, bool boundary = false);
  void publish_cache_gauges();
  bool several() const { return opt_.ranks && opt_.ranks->size() > 1; }

  SchedulerOptions opt_;
  io::ModelConfig cfg_;
  const io::text::Tokenizer& tok_;
  std::vector<int32_t> end_ids_;
  size_t capacity_;
  std::shared_ptr<const stages::TokenTable> json_table_;  // built at the first JSON request

  mutable std::mutex m_;
  std::condition_variable cv_;
  std::deque<std::pair<GenRequest, std::shared_ptr<Channel>>> queue_;
  bool stopping_ = false;
  std::chrono::steady_clock::time_point deadline_;
  std::optional<io::Error> failure_;
  bool failure_collective_ = false;
  bool fatal_ = false;       // several ranks: a step failed here alone (scheduler thread only)
  std::vector<int> resets_;  // several ranks: slots reset since the last step order (scheduler thread)

  std::atomic<Phase> phase_{Phase::loading};
  std::atomic<bool> streamed_{false};
  Gauges g_;
  std::unique_ptr<BatchEngine> engine_;          // scheduler thread only
  std::vector<std::unique_ptr<Active>> active_;  // scheduler thread only
  std::vector<bool> busy_;
  size_t free_slots_ = 0;  // slots no sequence holds (under m_): what submit counts beside --queue
  std::unique_ptr<PromptCache> cache_;  // scheduler thread only; null: no prompt cache
  std::vector<Active*> by_slot_;        // the sequence in each slot (scheduler thread; for the pass hook)
  std::thread thread_;
};

}  // namespace k3::pipeline::serve
