#include "pipeline/serve/scheduler.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <exception>
#include <utility>

#include "io/env.hpp"
#include "io/safetensors.hpp"
#include "io/text/text_stream.hpp"
#include "io/text/xtml.hpp"
#include "pipeline/run/batch_engine.hpp"
#include "pipeline/run/json_output.hpp"
#include "pipeline/run/streaming_run.hpp"
#include "pipeline/serve/rank_steps.hpp"
#include "pipeline/support/progress.hpp"

namespace k3::pipeline::serve {

namespace text = io::text;

const char* finish_name(Finish f) {
  switch (f) {
    case Finish::stop:
      return "stop";
    case Finish::length:
      return "length";
    case Finish::cancelled:
      return "cancelled";
    case Finish::error:
      return "error";
  }
  return "?";
}

const char* phase_name(Phase p) {
  switch (p) {
    case Phase::loading:
      return "loading";
    case Phase::ready:
      return "ready";
    case Phase::failed:
      return "failed";
    case Phase::stopped:
      return "stopped";
  }
  return "?";
}

namespace {

// An id's bytes; empty for a model row the tokenizer names nothing (vocabulary padding).
std::string token_text(const text::Tokenizer& tok, int32_t id) {
  if (id < tok.n_ids() && (id < tok.n_ranks() || tok.is_special(id))) return std::string(tok.token_bytes(id));
  return {};
}

}  // namespace

struct Scheduler::Active {
  Active(GenRequest r, std::shared_ptr<Channel> c, const text::Tokenizer& tok, std::vector<int32_t> end_ids,
         int vocab)
      : req(std::move(r)),
        ch(std::move(c)),
        sampler(req.sampling),
        stream(tok, req.ignore_eos ? std::vector<int32_t>{} : std::move(end_ids), req.stop),
        logits(size_t(vocab)) {
    context = req.prompt;
    pending = req.prompt;
    if (req.chat) {
      parser.emplace(req.thinking);
      parser->feed(req.reply_prefix);  // structure only: nothing of it is shown
    }
  }
  int slot = -1;
  GenRequest req;
  std::shared_ptr<Channel> ch;
  stages::Sampler sampler;
  text::TextStream stream;
  std::optional<text::ReplyParser> parser;
  std::vector<float> logits;
  std::vector<int32_t> context;  // prompt + generated: the sampler's repeat-penalty window
  std::vector<int32_t> pending;  // what is left to feed: the prompt's ids not yet fed, or the id sampled last
  bool prompting = true;         // pending is (the rest of) the prompt
  int generated = 0;
  int cached_tokens = 0;   // the prompt's first ids, restored from the prompt cache
  size_t snapshot_at = 0;  // positions of its last snapshot (or of the one it resumed from)
  bool done = false;
};

Scheduler::Scheduler(SchedulerOptions o, io::ModelConfig cfg, const io::text::Tokenizer& tok)
    : opt_(std::move(o)), cfg_(std::move(cfg)), tok_(tok), capacity_(run_capacity(opt_.dec)) {
  end_ids_ = text::end_of_turn_ids(tok_);
  thread_ = std::thread([this] { run(); });
}

Scheduler::~Scheduler() {
  stop(std::chrono::milliseconds(0));
}

std::optional<io::Error> Scheduler::failure() const {
  std::lock_guard lock(m_);
  return failure_;
}

bool Scheduler::failure_collective() const {
  std::lock_guard lock(m_);
  return failure_collective_;
}

bool Scheduler::wait_until_settled(std::chrono::milliseconds bound) {
  std::unique_lock lock(m_);
  return cv_.wait_for(lock, bound, [&] { return phase_ != Phase::loading; });
}

Scheduler::Submit Scheduler::submit(GenRequest r, std::shared_ptr<Channel> ch) {
  std::lock_guard lock(m_);
  if (stopping_) return Submit::stopping;
  if (phase_ != Phase::ready) return Submit::not_ready;
  // --queue bounds the requests that wait for a slot. Queued requests the free slots take at the
  // next step boundary do not wait, so a request is refused only when it would be number
  // free + --queue + 1 in line (with --queue 0: only when no slot is free for it).
  if (queue_.size() >= free_slots_ + size_t(std::max(opt_.queue, 0))) return Submit::queue_full;
  queue_.emplace_back(std::move(r), std::move(ch));
  g_.queued = int(queue_.size());
  cv_.notify_all();
  return Submit::queued;
}

void Scheduler::stop(std::chrono::milliseconds bound) {
  {
    std::lock_guard lock(m_);
    if (!stopping_) {
      stopping_ = true;
      deadline_ = std::chrono::steady_clock::now() + bound;
    } else {
      deadline_ = std::min(deadline_, std::chrono::steady_clock::now() + bound);
    }
    cv_.notify_all();
  }
  if (thread_.joinable()) thread_.join();
}

void Scheduler::run() {
  ranks::SingleComm alone;
  ranks::Comm& comm = opt_.ranks ? *opt_.ranks : alone;
  try {
    // Over several ranks every rank loads its slice, then all agree it worked: one that failed
    // (a missing or unreadable shard) ends every rank's run with its message.
    ranks::on_every_rank(comm, "could not load its slice", [&] {
      // What /health reports while the weights load: the bytes this process has read since loading
      // began, beside the checkpoint's size (a resident load reads about that much; a streamed one
      // reads its pinned share and is ready sooner).
      if (const int ms = io::env::integer_or_zero(io::env::kTestLoadDelayMs); ms > 0)
        std::this_thread::sleep_for(std::chrono::milliseconds(ms));
      g_.load_bytes_total = checkpoint_bytes(io::ShardSet::open(opt_.dec.model_dir));
      const uint64_t base = process_read_bytes();
      std::atomic<bool> loaded{false};
      std::thread watch([&] {
        while (!loaded) {
          g_.load_bytes_read = process_read_bytes() - base;
          std::this_thread::sleep_for(std::chrono::milliseconds(50));
        }
      });
      try {
        engine_ = std::make_unique<BatchEngine>(opt_.dec, cfg_, opt_.max_seqs);
      } catch (...) {
        loaded = true;
        watch.join();
        throw;
      }
      loaded = true;
      watch.join();
      g_.load_bytes_read = process_read_bytes() - base;
    });
    capacity_ = engine_->capacity();
    streamed_ = engine_->stream() != nullptr;
    engine_->set_prefill(opt_.prefill);
    busy_.assign(size_t(engine_->max_seqs()), false);
    by_slot_.assign(size_t(engine_->max_seqs()), nullptr);
    if (opt_.prompt_cache_bytes > 0 && !several()) {
      cache_ = std::make_unique<PromptCache>(opt_.prompt_cache_bytes);
      // A prompt longer than a pass is fed in several: a pass boundary is a prefix worth keeping
      // (another prompt sharing a system prompt resumes from the last one inside the shared part).
      engine_->set_after_partial_pass([this](int seq) {
        if (Active* a = by_slot_[size_t(seq)]; a && a->prompting) remember(*a, true);
      });
    }
    {
      std::lock_guard lock(m_);
      free_slots_ = busy_.size();
      phase_ = Phase::ready;
      cv_.notify_all();
    }
  } catch (const io::Error& e) {
    std::lock_guard lock(m_);
    failure_ = e;
    failure_collective_ = dynamic_cast<const ranks::CollectiveError*>(&e) != nullptr;
    phase_ = Phase::failed;
    cv_.notify_all();
    return;
  } catch (const std::exception& e) {
    std::lock_guard lock(m_);
    failure_ = io::runtime_error(e.what());
    phase_ = Phase::failed;
    cv_.notify_all();
    return;
  }
  loop();
  if (fatal_) return;  // phase failed: the other ranks are left in the step; the command ends the run
  if (several()) send_step(comm, StepOrder{.stop = true, .resets = {}, .rows = {}});
  engine_.reset();
  std::lock_guard lock(m_);
  phase_ = Phase::stopped;
  cv_.notify_all();
}

void Scheduler::end_queued(Finish f, const std::string& error) {
  for (auto& [r, ch] : queue_)
    ch->finish(
        Outcome{.finish = f, .error = error, .prompt_tokens = int(r.prompt.size()), .completion_tokens = 0});
  queue_.clear();
  g_.queued = 0;
}

void Scheduler::end_active(Finish f, const std::string& error) {
  for (auto& a : active_) finish(*a, f, error);
  active_.clear();
  g_.active = 0;
}

void Scheduler::fail_ranks(const std::string& error) {
  // This rank's step failed where the others' did not: they wait inside it for this rank's experts,
  // so nothing more can be computed. Every request ends with the error; the command ends the run.
  end_active(Finish::error, error);
  std::lock_guard lock(m_);
  end_queued(Finish::error, error);
  fatal_ = true;
  failure_ = io::runtime_error(fmt::format("a decode step failed on this rank: {}", error));
  phase_ = Phase::failed;
  cv_.notify_all();
}

void Scheduler::loop() {
  for (;;) {
    {
      std::unique_lock lock(m_);
      const auto can_admit = [&] {
        return !queue_.empty() && std::find(busy_.begin(), busy_.end(), false) != busy_.end();
      };
      cv_.wait(lock, [&] { return stopping_ || !active_.empty() || can_admit(); });
      if (stopping_ && std::chrono::steady_clock::now() >= deadline_) {
        // The bound passed: whatever is left is cancelled, queued requests included.
        end_queued(Finish::cancelled, "the server is shutting down");
        lock.unlock();
        end_active(Finish::cancelled, "the server is shutting down");
        return;
      }
      if (stopping_ && queue_.empty() && active_.empty()) return;
    }
    // Stopping with requests left: they run on until the deadline (checked above each step).
    admit();
    if (!active_.empty()) decode_step();
    if (fatal_) return;
  }
}

void Scheduler::admit() {
  std::unique_lock lock(m_);
  while (!queue_.empty()) {
    const auto free = std::find(busy_.begin(), busy_.end(), false);
    if (free == busy_.end()) break;
    auto [req, ch] = std::move(queue_.front());
    queue_.pop_front();
    g_.queued = int(queue_.size());
    if (ch->cancelled()) {
      ch->finish(Outcome{.finish = Finish::cancelled,
                         .error = {},
                         .prompt_tokens = int(req.prompt.size()),
                         .completion_tokens = 0});
      continue;
    }
    if (req.prompt.empty() || req.prompt.size() > capacity_) {
      ch->finish(Outcome{.finish = Finish::error,
                         .error = fmt::format("the prompt has {} tokens; a sequence holds 1 to {}",
                                              req.prompt.size(), capacity_),
                         .prompt_tokens = int(req.prompt.size()),
                         .completion_tokens = 0});
      continue;
    }
    auto a = std::make_unique<Active>(std::move(req), std::move(ch), tok_, end_ids_, cfg_.vocab);
    if (a->req.json) {
      if (!json_table_) json_table_ = json_token_table(tok_, cfg_.vocab, end_ids_);
      a->sampler.set_constraint(std::make_unique<stages::JsonConstraint>(
          a->req.json, json_table_, a->req.chat ? chat_reply_epilogue() : std::string()));
    }
    a->slot = int(free - busy_.begin());
    *free = true;
    --free_slots_;
    engine_->reset(a->slot);
    if (several()) resets_.push_back(a->slot);
    if (cache_)
      if (const BatchEngine::Snapshot* snap = cache_->lookup(a->req.prompt)) {
        engine_->restore(a->slot, *snap);
        a->pending.erase(a->pending.begin(), a->pending.begin() + long(snap->positions));
        a->cached_tokens = int(snap->positions);
        a->snapshot_at = snap->positions;
      }
    by_slot_[size_t(a->slot)] = a.get();
    g_.prompt_tokens += a->req.prompt.size();
    active_.push_back(std::move(a));
  }
  g_.active = int(active_.size());
  publish_cache_gauges();
}

void Scheduler::remember(Active& a, bool boundary) {
  // The slot holds the state after the first cached() ids of prompt + generated.
  const size_t n = engine_->cached(a.slot);
  // Inside a prompt, only where the positions have at least doubled since the sequence's last
  // snapshot: a prompt's snapshots then hold at most about twice its own state, where one at every
  // boundary would hold (and copy) its length squared over the boundaries' spacing.
  if (boundary && n < 2 * a.snapshot_at) return;
  const std::span<const int32_t> ids =
      std::span<const int32_t>(a.context).first(std::min(n, a.context.size()));
  if (ids.size() != n || !cache_->make_room(ids, engine_->snapshot_bytes(n))) return;
  if (cache_->insert(ids, engine_->snapshot(a.slot))) a.snapshot_at = n;
}

void Scheduler::publish_cache_gauges() {
  if (!cache_) return;
  const PromptCache::Stats& s = cache_->stats();
  g_.cache_hits = s.hits;
  g_.cache_misses = s.misses;
  g_.cache_hit_tokens = s.hit_tokens;
  g_.cache_inserts = s.inserts;
  g_.cache_evictions = s.evictions;
  g_.cache_bytes = cache_->bytes();
  g_.cache_entries = cache_->size();
}

void Scheduler::finish(Active& a, Finish f, std::string error) {
  if (a.done) return;
  a.done = true;
  // What the decoders still hold (a cut UTF-8 character, a tail that might have become a stop
  // string or a marker) is released when the generation ends without a stop.
  Delta last;
  if (f != Finish::error) {
    std::string tail = a.stream.finish();
    if (a.parser) {
      text::ReplyText t = a.parser->feed(tail);
      const text::ReplyText t2 = a.parser->finish();
      last.text = t.reply + t2.reply;
      last.reasoning = t.reasoning + t2.reasoning;
      for (const std::vector<text::ToolCall>* calls : {&std::as_const(t.calls), &t2.calls})
        for (const text::ToolCall& c : *calls) last.tool_calls.push_back(CallDelta{c.name, c.arguments});
    } else {
      last.text = std::move(tail);
    }
  }
  if (!last.text.empty() || !last.reasoning.empty() || !last.tool_calls.empty()) a.ch->push(std::move(last));
  // What the sequence was fed (prompt + reply but its last id) is the next turn's likely prefix.
  if (cache_ && (f == Finish::stop || f == Finish::length)) {
    remember(a);
    publish_cache_gauges();
  }
  by_slot_[size_t(a.slot)] = nullptr;
  {
    std::lock_guard lock(m_);
    busy_[size_t(a.slot)] = false;
    ++free_slots_;
  }
  g_.requests_done += 1;  // before the outcome: a client that sees it also sees the count
  a.ch->finish(Outcome{.finish = f,
                       .error = std::move(error),
                       .prompt_tokens = int(a.req.prompt.size()),
                       .completion_tokens = a.generated,
                       .cached_tokens = a.cached_tokens});
}

void Scheduler::decode_step() {
  // Sequences whose client went away leave before the step: their slot is free for the next one.
  for (auto& a : active_)
    if (a->ch->cancelled()) finish(*a, Finish::cancelled);
  std::erase_if(active_, [](const auto& a) { return a->done; });
  g_.active = int(active_.size());
  if (active_.empty()) return;

  // Which sequences feed this step, and how much of a prompt: the engine's prefill policy.
  std::vector<BatchEngine::Pending> pending;
  pending.reserve(active_.size());
  for (auto& a : active_)
    pending.push_back({.seq = a->slot, .ids = a->pending.size(), .prompt = a->prompting});
  const std::vector<size_t> feed = engine_->plan_step(pending);
  std::vector<BatchEngine::Row> rows;
  rows.reserve(active_.size());
  for (size_t i = 0; i < active_.size(); ++i)
    if (feed[i] > 0)
      rows.push_back(BatchEngine::Row{.seq = active_[i]->slot,
                                      .ids = std::span<const int32_t>(active_[i]->pending).first(feed[i]),
                                      .logits = active_[i]->logits});
  const auto t0 = std::chrono::steady_clock::now();
  // A step that failed leaves its sequences unusable: each is ended with the error, and its slot
  // is reset when the next sequence takes it. The server keeps serving.
  const auto failed = [&](const char* what) {
    std::fprintf(stderr, "k3flow serve: a decode step failed: %s\n", what);
    end_active(Finish::error, what);
  };
  try {
    // The rows' checks first: a bad row computes nothing (nor is it sent to the other ranks).
    engine_->check_rows(rows);
  } catch (const std::exception& e) {
    failed(e.what());
    return;
  }
  if (several()) {
    StepOrder order{.stop = false, .resets = std::move(resets_), .rows = {}};
    resets_.clear();
    for (const BatchEngine::Row& r : rows)
      order.rows.push_back({.seq = r.seq, .ids = std::vector<int32_t>(r.ids.begin(), r.ids.end())});
    send_step(*opt_.ranks, order);
  }
  try {
    engine_->step(rows);
  } catch (const io::Error& e) {
    // Non-finite logits are every rank's (their hidden states are equal): they serve on alike.
    if (several() && e.kind() != io::ErrorKind::run_invalid) {
      fail_ranks(e.what());
      return;
    }
    failed(e.what());
    return;
  } catch (const std::exception& e) {
    if (several()) {
      fail_ranks(e.what());
      return;
    }
    failed(e.what());
    return;
  }
  g_.step_micros += uint64_t(
      std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - t0).count());
  g_.decode_steps += 1;
  if (StreamRun* run = engine_->stream()) {
    const StreamTotals t = run->totals();
    g_.stream_bytes = t.trunk_bytes_read + t.expert_bytes_read;
    g_.trunk_bytes = t.trunk_bytes_read;
    g_.expert_bytes = t.expert_bytes_read;
    g_.expert_requests = t.expert_requests;
    g_.expert_hits = t.expert_hits;
    g_.io_busy_micros = uint64_t(t.io_busy_seconds * 1e6);
    g_.compute_busy_micros = uint64_t(t.compute_busy_seconds * 1e6);
  }

  for (size_t i = 0; i < active_.size(); ++i) {
    Active& a = *active_[i];
    // A sequence samples once everything it had pending is fed (a prompt may take several steps).
    if (feed[i] == 0) continue;
    a.pending.erase(a.pending.begin(), a.pending.begin() + long(feed[i]));
    if (cache_ && a.prompting) remember(a, !a.pending.empty());  // a chunk's end, or the prompt's
    if (!a.pending.empty()) continue;
    a.prompting = false;
    int32_t id = 0;
    Delta d;
    try {
      id = a.sampler.next(a.logits, a.context);
      if (a.req.logprobs >= 0) {
        // The model's distribution: the row as the engine produced it (docs/sampling.md).
        const stages::TokenLogprob lp = stages::token_logprob(a.logits, id, a.req.logprobs);
        TokenLogprobs t{token_text(tok_, id), lp.logprob, {}};
        for (const stages::TopLogprob& alt : lp.top)
          t.top.emplace_back(token_text(tok_, alt.id), alt.logprob);
        d.logprobs.push_back(std::move(t));
      }
    } catch (const std::exception& e) {
      finish(a, Finish::error, e.what());
      continue;
    }
    a.context.push_back(id);
    a.pending.assign(1, id);
    ++a.generated;
    g_.completion_tokens += 1;
    const text::TextStream::Out out = a.stream.push(id);
    d.ids.push_back(id);
    // A vocabulary without end ids: a complete JSON value ends the generation itself.
    bool stop = out.stop || (a.sampler.constraint() && a.sampler.constraint()->done());
    if (a.parser) {
      const text::ReplyText t = a.parser->feed(out.text);
      d.text = t.reply;
      d.reasoning = t.reasoning;
      for (const text::ToolCall& c : t.calls) d.tool_calls.push_back(CallDelta{c.name, c.arguments});
      const auto st = a.parser->state();
      if (st == text::ReplyParser::State::done || st == text::ReplyParser::State::malformed) stop = true;
      if (a.req.max_calls > 0 && a.parser->calls().size() >= size_t(a.req.max_calls)) stop = true;
    } else {
      d.text = out.text;
    }
    if (!a.ch->push(std::move(d))) {
      finish(a, Finish::cancelled, "the client fell too far behind");
      continue;
    }
    if (stop)
      finish(a, Finish::stop);
    else if (a.generated >= a.req.max_tokens || engine_->cached(a.slot) + 1 > capacity_)
      finish(a, Finish::length);
  }
  std::erase_if(active_, [](const auto& a) { return a->done; });
  g_.active = int(active_.size());
  publish_cache_gauges();
}

}  // namespace k3::pipeline::serve
