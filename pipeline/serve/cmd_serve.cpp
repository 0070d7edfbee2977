// `k3flow serve MODEL_DIR`: an OpenAI-compatible HTTP server (docs/serve.md). It checks every flag
// (paths, the config, the shards' headers, a budget against the plan's floor), binds the port -- a
// port in use ends it there, before any weight is read -- and only then says `listening on
// http://HOST:PORT` on stdout and opens the model on the scheduler thread, so GET /health answers
// 503 with the load's progress until the weights are in. A load that fails stops the server at once
// (the port closes) and exits with the error's code. Diagnostics (the load, the plan) go to stderr,
// line by line as they are printed; stdout carries only the listening line. SIGINT / SIGTERM stop
// accepting, let in-flight requests finish within --drain-seconds (then cancel them), print what was
// drained on stderr and exit 0.
// Under mpirun (docs/distributed.md §6) rank 0 is the server and the scheduler; the other ranks load
// their slice of the experts and run the steps rank 0 sends them (pipeline/serve/rank_steps.hpp). They
// ignore SIGINT / SIGTERM: the signal to rank 0 drains the server, then rank 0 tells them to stop and
// every rank exits 0.
#include <fmt/format.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>

#include "io/error.hpp"
#include "io/packed_trunk.hpp"
#include "pipeline/graph/streaming_source.hpp"
#include "pipeline/ranks/comm.hpp"
#include "pipeline/ranks/rank_experts.hpp"
#include "pipeline/run/batch_engine.hpp"
#include "pipeline/run/decoder.hpp"
#include "pipeline/run/run_context.hpp"
#include "pipeline/run/streaming_run.hpp"
#include "pipeline/serve/http.hpp"
#include "pipeline/serve/rank_steps.hpp"
#include "pipeline/serve/scheduler.hpp"
#include "pipeline/serve/serve_command.hpp"
#include "pipeline/support/human_bytes.hpp"
#include "pipeline/support/interrupt.hpp"
#include "pipeline/support/output_file.hpp"

namespace k3::pipeline {

namespace {

struct ServeArgs {
  DecoderOptions dec;
  std::optional<std::string> tokenizer, model_name, api_key, cors;
  std::string host = "127.0.0.1", prefill = "inline";
  size_t prefill_chunk = 0;
  int max_seqs = 4, queue = 16, threads = 0, port = 8080, max_connections = 64;
  size_t context = 4096, max_body_kb = 1024;
  double drain_seconds = 10, idle_seconds = 30, read_seconds = 30, write_seconds = 30;
  std::string thinking = "on";
  int max_reply = 512;
};

// A budget below the plan's floor is refused before the server listens, by the plan the scheduler's
// engine makes when it loads (the same flags, slots and positions): only the shards' headers
// (`shards`, already read) and the trunk's index are read here.
void check_budget(const ServeArgs& a, const io::ModelConfig& cfg, const io::ShardSet& shards) {
  if (!a.dec.stream.budget_given() && a.dec.stream.trunk_dir.empty()) return;
  StreamFlags flags = a.dec.stream;
  flags.max_seqs = a.max_seqs;
  const int layers = bound_layers(cfg, a.dec.layers);
  std::optional<io::PackedTrunk> trunk;
  if (!flags.trunk_dir.empty()) trunk.emplace(io::PackedTrunk::open(flags.trunk_dir, cfg.n_layers));
  const std::unique_ptr<WeightSources> src =
      WeightSources::open(cfg, shards, trunk ? &*trunk : nullptr, layers);
  plan_run(flags, *src, run_capacity(a.dec), flags.ring);
}

std::chrono::milliseconds millis(double seconds) {
  return std::chrono::milliseconds(int64_t(seconds * 1000));
}

const char* signal_name(int sig) {
  return sig == SIGINT ? "SIGINT" : "SIGTERM";
}

// The signals that stop the server, blocked in every thread (the scheduler's and the connections'
// inherit the mask) so no blocking read is interrupted; the accept loop polls for them. Threads
// started before the mask (MPI's, under mpirun) may still take one: the handler then records it.
struct StopSignals {
  sigset_t set;
  sigset_t old;
  InterruptScope record;
  StopSignals() {
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &set, &old);
  }
  ~StopSignals() { pthread_sigmask(SIG_SETMASK, &old, nullptr); }
  int pending() const {
    timespec zero{0, 0};
    const int sig = sigtimedwait(&set, nullptr, &zero);
    return sig > 0 ? sig : InterruptScope::signal_number();
  }
};

// A rank other than 0 under mpirun: its slice of the experts, loaded with every rank, then the steps
// rank 0's scheduler sends until it says stop. Its stdout is closed (ranks::Session); a failure of its
// own ends every rank's run, naming it (main).
int follow_serve(const ServeArgs& a, const io::ModelConfig& cfg, ranks::Comm& comm) {
  const StopSignals ignored;  // rank 0 decides when to stop: its stop order ends this rank
  std::unique_ptr<BatchEngine> engine;
  ranks::on_every_rank(comm, "could not load its slice",
                       [&] { engine = std::make_unique<BatchEngine>(a.dec, cfg, a.max_seqs); });
  serve::follow_steps(comm, *engine);
  return 0;
}

// stdout carries only the listening line (a script or test reads it), on the stream returned; the
// load's prints go to stderr (under mpirun rank 0's alone: the others' stdout is closed,
// ranks::Session).
FILE* split_stdout(bool lead) {
  std::fflush(stdout);
  FILE* announce = stdout;
  if (lead)
    if (const int fd = dup(STDOUT_FILENO); fd >= 0 && dup2(STDERR_FILENO, STDOUT_FILENO) >= 0)
      if (FILE* f = fdopen(fd, "w")) announce = f;
  // The prints to stdout now reach stderr's descriptor, line by line: each load line is there when
  // it is printed (stdio would buffer a file or a pipe in blocks, held until the process exits).
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  return announce;
}

// ---- paths, serve's own flags, threads, config: the run context ----
RunSpec run_spec(ServeArgs& a, ranks::Comm& comm, PrefillPolicy& prefill) {
  RunSpec s{.dec = a.dec, .tokenizer = a.tokenizer, .threads = a.threads};
  s.checks = [&a, &comm, &prefill] {
    serve::check_host(a.host);
    prefill = PrefillPolicy{.mode = parse_prefill_mode(a.prefill, "--prefill"), .chunk = a.prefill_chunk};
    if (a.api_key && a.api_key->empty()) throw io::usage_error("--api-key: empty");
    if (a.cors && (a.cors->empty() || a.cors->find_first_of("\r\n ,") != std::string::npos))
      throw io::usage_error(fmt::format("--cors '{}': give one origin (https://host[:port]) or *", *a.cors));
    if (comm.size() > 1 && a.dec.stream.prompt_cache_gb > 0)
      throw io::usage_error("--prompt-cache-gb: not available over several ranks (each would restore alike)");
    if (a.context > kMaxPositions)
      throw io::usage_error(fmt::format("--context {}: more than the {} positions this build allows",
                                        a.context, kMaxPositions));
  };
  return s;
}

// ---- the model's files ----
// Every shard's header, read and checked on every rank (a truncated or corrupt shard, named, exit
// 1): a checkpoint that cannot load ends the command here, so the server never says it is
// listening. Under mpirun the refusal is the one a rank's failed load gives. The shards close on
// return: the scheduler's engine opens its own.
void check_shards(ServeArgs& a, const io::ModelConfig& cfg, ranks::Comm& comm) {
  std::optional<io::ShardSet> shards;
  ranks::on_every_rank(comm, "could not load its slice",
                       [&] { shards.emplace(io::ShardSet::open(a.dec.model_dir)); });
  a.dec.capacity = a.context;
  // One process: its plan is the scheduler's (several ranks plan each its own slice, as they load).
  if (comm.size() == 1) check_budget(a, cfg, *shards);
}

// The model id clients name: --model-name, else MODEL_DIR's name.
std::string model_name(const ServeArgs& a) {
  std::string name =
      a.model_name.value_or(std::filesystem::path(a.dec.model_dir).lexically_normal().filename());
  if (name.empty()) name = std::filesystem::path(a.dec.model_dir).lexically_normal().parent_path().filename();
  return name;
}

serve::ServerOptions server_options(const ServeArgs& a, const std::string& name) {
  return serve::ServerOptions{.host = a.host,
                              .port = uint16_t(a.port),
                              .api_key = a.api_key,
                              .max_body_bytes = a.max_body_kb * 1024,
                              .model = name,
                              .max_connections = a.max_connections,
                              .channel_bytes = 1 << 20,
                              .idle = millis(a.idle_seconds),
                              .read = millis(a.read_seconds),
                              .write = millis(a.write_seconds),
                              .cors_origin = a.cors,
                              .thinking = a.thinking == "on",
                              .max_reply = a.max_reply};
}

// The listening line on `announce`, then what is served on stderr.
void announce_listening(const ServeArgs& a, ranks::Comm& comm, const std::string& name,
                        const std::string& url, FILE* announce) {
  std::fprintf(announce, "listening on %s\n", url.c_str());
  std::fflush(announce);
  std::fprintf(stderr, "k3flow serve: model '%s' at %s, %d sequences of %zu positions, queue %d; loading\n",
               name.c_str(), url.c_str(), a.max_seqs, a.context, a.queue);
  if (const uint64_t cache = prompt_cache_bytes(a.dec.stream); cache > 0)
    std::fprintf(stderr, "k3flow serve: prompt cache of %s (prefix snapshots, docs/serve.md)\n",
                 human_bytes(double(cache)).c_str());
  if (comm.size() > 1)
    std::fprintf(stderr,
                 "k3flow serve: rank 0 of %d (pid %d) serves; the other ranks follow its steps with their "
                 "experts. SIGTERM or SIGINT to this pid drains every rank\n",
                 comm.size(), int(::getpid()));
}

// Serves until a signal (or a failed load) stops it; the drain, on stderr.
int serve_until_stopped(const ServeArgs& a, serve::Server& server, serve::Scheduler& sched,
                        const StopSignals& signals) {
  int sig = 0;
  bool announced_ready = false;
  const serve::DrainReport drained = server.run(
      sched,
      [&] {
        if (!announced_ready && sched.phase() == serve::Phase::ready) {
          announced_ready = true;
          std::fprintf(stderr, "k3flow serve: ready\n");
        }
        if (sched.phase() == serve::Phase::failed) return true;
        sig = signals.pending();
        return sig != 0;
      },
      millis(a.drain_seconds));
  if (sched.phase() == serve::Phase::failed && sched.failure()) {
    // A rank that could not load its slice failed every rank's load: printed once, by rank 0.
    if (sched.failure_collective())
      throw ranks::CollectiveError(sched.failure()->kind(), sched.failure()->what());
    throw *sched.failure();
  }
  std::fprintf(
      stderr,
      "k3flow serve: stopped by %s: %d request%s in flight, %d finished, %d cancelled at the %g s drain "
      "bound; %d connection%s closed\n",
      signal_name(sig), drained.in_flight, drained.in_flight == 1 ? "" : "s",
      drained.in_flight - drained.cancelled, drained.cancelled, a.drain_seconds, drained.connections,
      drained.connections == 1 ? "" : "s");
  return 0;
}

// Rank 0 (or the only process): binds the port, then loads the model on the scheduler's thread.
int serve_model(const ServeArgs& a, const RunContext& ctx, ranks::Comm& comm, const PrefillPolicy& prefill,
                FILE* announce) {
  std::printf("%s\n", ctx.cfg.summary().c_str());

  StopSignals signals;
  const std::string name = model_name(a);
  serve::Server server(server_options(a, name), *ctx.tok);
  // Bound: the weights load now, on the scheduler's thread.
  serve::Scheduler sched(serve::SchedulerOptions{.dec = a.dec,
                                                 .max_seqs = a.max_seqs,
                                                 .queue = a.queue,
                                                 .prefill = prefill,
                                                 .prompt_cache_bytes = prompt_cache_bytes(a.dec.stream),
                                                 .ranks = comm.size() > 1 ? &comm : nullptr},
                         ctx.cfg, *ctx.tok);
  const std::string url = a.host.find(':') != std::string::npos
                              ? fmt::format("http://[{}]:{}", a.host, server.port())
                              : fmt::format("http://{}:{}", a.host, server.port());
  announce_listening(a, comm, name, url, announce);
  return serve_until_stopped(a, server, sched, signals);
}

int run_serve(ServeArgs a) {
  ranks::Comm& comm = ranks::world();
  const bool lead = comm.rank() == 0;
  FILE* announce = split_stdout(lead);

  // Under mpirun every rank checks the command line, and a refusal is printed once (by rank 0,
  // naming the rank): the ranks share one command line, but each has its own view of the paths.
  PrefillPolicy prefill;
  std::optional<RunContext> ctx;
  ranks::on_every_rank(comm, "refused the command", [&] {
    ctx.emplace(run_spec(a, comm, prefill));
    if (lead) ctx->load_tokenizer("serve");  // rank 0 serves text
  });
  check_shards(a, ctx->cfg, comm);
  // Several ranks: each holds and computes only its experts (docs/distributed.md §6).
  std::optional<ranks::RankExperts> experts;
  if (comm.size() > 1) {
    experts.emplace(comm);
    a.dec.experts = &*experts;
    a.dec.ranks = comm.size();
    if (!lead) {
      a.dec.stream.trace.clear();  // the graph's trace and DOT dump: rank 0's
      a.dec.stream.graph_dot.clear();
      return follow_serve(a, ctx->cfg, comm);
    }
  }
  return serve_model(a, *ctx, comm, prefill, announce);
}

}  // namespace

Action add_serve(CLI::App& sub) {
  auto a = std::make_shared<ServeArgs>();
  sub.add_option("MODEL_DIR", a->dec.model_dir, "checkpoint directory (config.json + *.safetensors)")
      ->required();
  sub.add_option("--host", a->host, "address to listen on (loopback by default)")->capture_default_str();
  sub.add_option("--port", a->port, "TCP port (0: any free port; the listening line names it)")
      ->check(CLI::Range(0, 65535))
      ->capture_default_str();
  sub.add_option("--max-seqs", a->max_seqs, "sequences decoded together (state slots)")
      ->check(CLI::Range(1, 256))
      ->capture_default_str();
  sub.add_option("--queue", a->queue, "requests that may wait for a slot; more get 429")
      ->check(CLI::Range(0, 65536))
      ->capture_default_str();
  sub.add_option("--prefill", a->prefill,
                 "a joining prompt: inline (in the decode step, beside the others' ids) or separate "
                 "(a step of its own; the decoding sequences skip it)")
      ->capture_default_str();
  sub.add_option("--prefill-chunk", a->prefill_chunk,
                 "prompt ids a sequence feeds per step at most (0: the whole prompt in one step)")
      ->check(CLI::Range(size_t(0), kMaxPositions))
      ->capture_default_str();
  sub.add_option("--api-key", a->api_key, "require Authorization: Bearer KEY (all routes but /health)");
  sub.add_option("--context", a->context, "positions per sequence (prompt + reply)")
      ->check(CLI::Range(size_t(2), kMaxPositions))
      ->capture_default_str();
  sub.add_option("--max-body-kb", a->max_body_kb, "largest request body, KiB (413 beyond)")
      ->check(CLI::Range(size_t(1), size_t(1) << 20))
      ->capture_default_str();
  sub.add_option("--max-connections", a->max_connections, "open connections served at once (503 beyond)")
      ->check(CLI::Range(1, 100000))
      ->capture_default_str();
  sub.add_option("--drain-seconds", a->drain_seconds,
                 "on SIGINT / SIGTERM: how long in-flight requests may run before they are cancelled")
      ->check(CLI::Range(0.0, 3600.0))
      ->capture_default_str();
  sub.add_option("--idle-seconds", a->idle_seconds,
                 "a connection with no request started this long after it opened or after its last "
                 "response is closed (a silent socket cannot hold a --max-connections slot)")
      ->check(CLI::Range(0.05, 86400.0))
      ->capture_default_str();
  sub.add_option("--read-seconds", a->read_seconds,
                 "a request's headers and body must arrive within this many seconds of its first byte "
                 "(else 408 and the connection is closed)")
      ->check(CLI::Range(0.05, 86400.0))
      ->capture_default_str();
  sub.add_option("--write-seconds", a->write_seconds,
                 "each write to a client (an answer, one event of a stream) must be taken within this "
                 "many seconds, else the connection is closed and its request cancelled (a client that "
                 "stops reading cannot hold a --max-connections slot)")
      ->check(CLI::Range(0.05, 86400.0))
      ->capture_default_str();
  sub.add_option("--cors", a->cors,
                 "allow browser pages from ORIGIN (or *): Access-Control-Allow-Origin on every answer, "
                 "OPTIONS preflight answered (without it OPTIONS is 405)");
  sub.add_option("--thinking", a->thinking,
                 "chat requests that do not set 'thinking': on (the think channel first, the answer in "
                 "content once it closes) or off (the answer at once)")
      ->check(CLI::IsMember({"on", "off"}))
      ->capture_default_str();
  sub.add_option("--max-reply", a->max_reply,
                 "tokens a reply may have: a chat request's default max_tokens, and every request's "
                 "cap (a larger max_tokens is clamped; finish_reason says length)")
      ->check(CLI::Range(1, 1 << 24))
      ->capture_default_str();
  sub.add_option("--model-name", a->model_name, "the model id clients name (default: MODEL_DIR's name)");
  sub.add_option("--tokenizer", a->tokenizer,
                 "tokenizer directory (tiktoken.model + tokenizer_config.json; default MODEL_DIR)");
  sub.add_option("--config", a->dec.config, "config.json to use (default MODEL_DIR/config.json)");
  sub.add_option("--threads", a->threads, "compute threads (0 = oneTBB default)")->check(CLI::Range(0, 4096));
  add_stream_flags(sub, a->dec.stream);
  add_prompt_cache_flag(sub, a->dec.stream);
  return [a] { return run_serve(*a); };
}

}  // namespace k3::pipeline
