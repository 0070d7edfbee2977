// `k3flow generate MODEL_DIR`: one prompt, one continuation.
//   --ids 1,2,3         ids in; the STEP table and the generated ids on stdout (the reference CLI's
//                       output, and what the bench and the tests parse);
//   --prompt / --prompt-file
//                       text in; stdout carries only the continuation, printed as it is generated;
//                       everything else (load, plan, summary) goes to stderr.
// Decoding is incremental (KV cache + carried KDA state) unless --recompute; greedy unless
// --temperature > 0 (pipeline/run/decoder.hpp, stages/sampler.hpp). Text runs stop at the end of the
// model's turn ([EOS] / <|end_of_msg|>) or at a --stop string; --gen caps every run.
// --spec N (greedy only): up to N prompt-lookup drafts verified per pass, the same ids and logits
// (pipeline/run/speculative.hpp, docs/speculative.md); --spec-min-match / --spec-policy choose when
// and how much to draft (pipeline/run/draft_policy.hpp).
#include <fmt/format.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "io/error.hpp"
#include "io/text/text_stream.hpp"
#include "pipeline/cli/commands.hpp"
#include "pipeline/ranks/rank_experts.hpp"
#include "pipeline/run/decoder.hpp"
#include "pipeline/run/draft_policy.hpp"
#include "pipeline/run/json_output.hpp"
#include "pipeline/run/run_context.hpp"
#include "pipeline/run/run_report.hpp"
#include "pipeline/run/sampler_flags.hpp"
#include "pipeline/run/speculative.hpp"
#include "pipeline/support/clock.hpp"
#include "pipeline/support/human_bytes.hpp"
#include "pipeline/support/id_list.hpp"
#include "pipeline/support/interrupt.hpp"
#include "pipeline/support/output_file.hpp"
#include "pipeline/support/process_memory.hpp"
#include "pipeline/support/terminal_text.hpp"
#include "stages/json_constraint.hpp"

namespace k3::pipeline {

namespace {

constexpr int kMaxGen = 4096;

struct GenerateOptions {
  DecoderOptions dec;
  std::optional<std::string> ids, prompt, prompt_file, tokenizer, out_path, dump_logits, save_state,
      load_state, spec_oracle, spec_policy, json_schema;
  std::vector<std::string> stop;
  int gen = 128;
  bool incremental = false, print_ids = false, ignore_eos = false, json_object = false;
  int threads = 0;
  int spec = 0;  // --spec: drafts per verify pass (0: off)
  std::optional<int> spec_min_match;
  stages::SamplerOptions sampling;
};

// A saved state's nseq sizes the KV cache before the file is read in full, so a corrupt one must be
// refused here, naming the file, not later as a --gen that is too large.
void check_saved_positions(const std::filesystem::path& path, const StateHeader& h) {
  const uint64_t nseq = static_cast<uint64_t>(h.nseq), ids_end = kStateHeaderBytes + 4 * nseq;
  std::error_code ec;
  const uint64_t size = std::filesystem::file_size(path, ec);
  if (!ec && size < ids_end)
    throw io::runtime_error(fmt::format(
        "{}: corrupt header: nseq = {} saved positions need {} bytes of token ids and header, the file "
        "is {} bytes",
        path.string(), nseq, ids_end, size));
  if (nseq >= kMaxPositions)
    throw io::runtime_error(fmt::format("{}: nseq = {} saved positions, more than the {} this build allows",
                                        path.string(), nseq, kMaxPositions - 1));
}

// A whole file, read verbatim; a missing or unreadable one names the flag (exit 2).
std::string read_text_file(const std::string& path, const char* flag) {
  check_input_file(path, flag);
  std::ifstream f(path, std::ios::binary);
  if (!f) throw io::usage_error(fmt::format("{} {}: cannot be read", flag, path));
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

std::string read_prompt_file(const std::string& path) {
  return read_text_file(path, "--prompt-file");
}

// In text mode stdout carries only the continuation: the descriptor the user sees as stdout is
// kept for the text, and fd 1 is pointed at stderr, so every diagnostic printf lands there. On a
// terminal the text's control characters are shown escaped (support/terminal_text.hpp); to a file
// or a pipe it is written as generated.
struct TextOut {
  FILE* text = stdout;
  bool escape = is_terminal(stdout);
  void split_from_diagnostics() {
    std::fflush(stdout);
    const int fd = dup(STDOUT_FILENO);
    if (fd < 0 || dup2(STDERR_FILENO, STDOUT_FILENO) < 0) return;  // keep one stream if dup fails
    text = fdopen(fd, "w");
    if (!text) text = stdout;
  }
  void write(const std::string& s) {
    if (s.empty()) return;
    const std::string shown = escape ? terminal_escaped(s) : s;
    std::fwrite(shown.data(), 1, shown.size(), text);
    std::fflush(text);
  }
};

// What generate's usage checks decide before any model file is read.
struct GenerateUsage {
  bool text_mode = false;                          // --prompt / --prompt-file (else --ids)
  std::shared_ptr<const stages::JsonSchema> json;  // --json-schema / --json-object
  DraftPolicyOptions policy;                       // --spec, --spec-min-match, --spec-policy
  std::vector<int32_t> given_ids;                  // --ids
};

// JSON output: the schema is compiled (and refused, naming the keyword) before any model file is read.
std::shared_ptr<const stages::JsonSchema> json_output(const GenerateOptions& o, bool text_mode) {
  std::shared_ptr<const stages::JsonSchema> json;
  if (o.json_schema && o.json_object)
    throw io::usage_error("--json-schema and --json-object exclude each other");
  if (o.json_schema) {
    check_input_file(*o.json_schema, "--json-schema");
    json = std::make_shared<stages::JsonSchema>(stages::compile_json_schema(
        read_text_file(*o.json_schema, "--json-schema"), "--json-schema " + *o.json_schema));
  } else if (o.json_object) {
    json = std::make_shared<stages::JsonSchema>(stages::json_object_schema());
  }
  const char* json_flag = o.json_schema ? "--json-schema" : "--json-object";
  if (json && !text_mode)
    throw io::usage_error(fmt::format("{} needs a text prompt (--prompt / --prompt-file)", json_flag));
  if (json && o.spec > 0)
    throw io::usage_error(
        fmt::format("{} and --spec exclude each other (drafts are not constrained)", json_flag));
  if (json && o.ignore_eos)
    throw io::usage_error(
        fmt::format("{} and --ignore-eos exclude each other (the value ends the turn)", json_flag));
  return json;
}

// ---- usage checks that need no files ----
GenerateUsage check_usage(GenerateOptions& o) {
  GenerateUsage u;
  const int sources = (o.ids ? 1 : 0) + (o.prompt ? 1 : 0) + (o.prompt_file ? 1 : 0);
  if (sources != 1)
    throw io::usage_error(
        fmt::format("exactly one of --ids, --prompt, --prompt-file is required ({} given)", sources));
  u.text_mode = !o.ids;
  stages::validate(o.sampling);
  if (o.dump_logits && o.gen == 0) throw io::usage_error("--dump-logits needs --gen >= 1 (it dumps step 0)");
  if (o.incremental && o.dec.recompute)
    throw io::usage_error("--incremental and --recompute exclude each other");
  check_spec_flag(o.spec, o.sampling, o.dec.recompute);
  u.policy = spec_policy_options(o.spec, o.spec_min_match, o.spec_policy);
  o.dec.stream.spec = o.spec;  // a streamed run's plan holds the verify pass's journal
  if (o.spec_oracle && o.spec == 0) throw io::usage_error("--spec-oracle needs --spec N (N >= 1)");
  if (!o.stop.empty() && !u.text_mode)
    throw io::usage_error("--stop needs a text prompt (--prompt / --prompt-file)");
  u.json = json_output(o, u.text_mode);
  // The vocabulary is known only once config.json is read (checked below); --load-state may
  // resume with no new ids.
  if (!u.text_mode) u.given_ids = parse_id_list(*o.ids, "--ids", 0, o.load_state.has_value());
  return u;
}

// Under mpirun rank 0 reads the prompt and sends it to the others (docs/distributed.md).
std::string read_prompt(const GenerateOptions& o, const GenerateUsage& u, ranks::Comm& comm) {
  std::string prompt_text;
  ranks::on_every_rank(comm, "could not read the prompt", [&] {
    if (comm.rank() == 0)
      prompt_text = o.prompt ? *o.prompt : o.prompt_file ? read_prompt_file(*o.prompt_file) : "";
  });
  prompt_text = ranks::from_rank0(comm, prompt_text);
  if (!o.load_state && u.text_mode && prompt_text.empty()) throw io::usage_error("the prompt is empty");
  return prompt_text;
}

// The flags that only show a streamed run are refused without one.
void check_streamed_only(const StreamFlags& s) {
  for (const auto& [flag, value] : {std::pair{"--trace", s.trace},
                                    {"--graph-dot", s.graph_dot},
                                    {"--routing-trace", s.routing_trace},
                                    {"--bench-routing-replay", s.routing_replay}})
    if (!value.empty() && !s.requested())
      throw io::usage_error(fmt::format(
          "{} shows a streamed run: add a budget (--mem-gb, --preset, --trunk-gb + --cache-gb) or --trunk",
          flag));
}

// ---- paths (every one checked before the first read), threads, config: the run context ----
RunSpec run_spec(GenerateOptions& o) {
  using Kind = PathCheck::Kind;
  RunSpec s{.dec = o.dec, .tokenizer = o.tokenizer, .threads = o.threads};
  if (o.load_state) s.before_trunk.push_back({Kind::input_file, "--load-state", *o.load_state});
  for (const auto& [flag, path] :
       {std::pair{"--out", o.out_path}, {"--dump-logits", o.dump_logits}, {"--save-state", o.save_state}})
    if (path) s.after_trunk.push_back({Kind::writable, flag, *path});
  const StreamFlags& st = o.dec.stream;
  for (const auto& [flag, path] :
       {std::pair{"--trace", st.trace}, {"--graph-dot", st.graph_dot}, {"--routing-trace", st.routing_trace}})
    if (!path.empty()) s.after_trunk.push_back({Kind::writable, flag, path});
  if (!st.routing_replay.empty())
    s.after_trunk.push_back({Kind::input_file, "--bench-routing-replay", st.routing_replay});
  return s;
}

// ---- model: the config's summary, the tokenizer, the prompt's ids ----
std::vector<int32_t> prompt_ids(const GenerateOptions& o, const GenerateUsage& u, RunContext& ctx,
                                const std::string& prompt_text) {
  std::printf("%s\n", ctx.cfg.summary().c_str());
  ctx.load_tokenizer(u.text_mode ? (o.prompt ? "--prompt" : "--prompt-file") : nullptr);
  std::vector<int32_t> prompt = u.text_mode ? ctx.tok->encode(prompt_text, true) : u.given_ids;
  if (prompt.empty() && !o.load_state)
    throw io::usage_error(u.text_mode ? "the prompt is empty" : "--ids: no token ids given");
  if (!u.text_mode) check_ids_in_vocab(prompt, ctx.cfg.vocab, "--ids");
  return prompt;
}

// ---- plan: the positions, a resume header read before anything is sized ----
std::optional<StateHeader> size_run(GenerateOptions& o, size_t prompt_size) {
  std::optional<StateHeader> saved;
  if (o.load_state) {
    saved = peek_state(*o.load_state);
    check_saved_positions(*o.load_state, *saved);
  }
  const size_t prior = saved ? static_cast<size_t>(saved->nseq) : 0;
  o.dec.capacity = prior + prompt_size + static_cast<size_t>(o.gen) + 1;
  if (o.dec.capacity > kMaxPositions) {
    const std::string from_state =
        saved ? fmt::format("{} saved positions in {} + ", prior, *o.load_state) : std::string();
    throw io::usage_error(fmt::format("{}prompt + --gen + 1 = {} positions exceeds the {} this build allows",
                                      from_state, o.dec.capacity, kMaxPositions));
  }
  o.dec.expected_calls = o.gen;
  run_capacity(o.dec);  // a --context below what the run needs is refused before the header
  return saved;
}

void print_run_header(const GenerateOptions& o, const GenerateUsage& u, const io::ModelConfig& cfg,
                      size_t prompt_size, const std::optional<StateHeader>& saved) {
  std::printf("\nKimi K3, k3flow, released checkpoint layout\n");
  std::printf("  model   : %s\n", o.dec.model_dir.c_str());
  if (saved)
    std::printf("  prompt  : %zu saved + %zu new ids\n", static_cast<size_t>(saved->nseq), prompt_size);
  else
    std::printf("  prompt  : %zu ids\n", prompt_size);
  std::printf("  decode  : %s, %s, up to %d tokens, threads %s\n", describe_sampling(o.sampling).c_str(),
              o.dec.recompute ? "full recompute" : "incremental (KV cache + carried KDA state)", o.gen,
              o.threads > 0 ? std::to_string(o.threads).c_str() : "default");
  if (u.json)
    std::printf(
        "  output  : JSON, %s\n",
        o.json_schema ? fmt::format("matching the schema in {}", *o.json_schema).c_str() : "one object");
  if (o.spec > 0)
    std::printf(
        "  spec    : up to %d prompt-lookup drafts verified per pass (greedy, same ids and logits); %s "
        "policy, matches of >= %zu ids\n",
        o.spec, u.policy.adaptive ? "adaptive" : "fixed", u.policy.min_match);
  if (o.dec.layers > 0 && o.dec.layers < cfg.n_layers)
    std::printf(
        "  NOTE    : --layers %d runs only the first %d of %d layers; the output is not the model's\n",
        o.dec.layers, o.dec.layers, cfg.n_layers);
}

// ---- the weights ----
// Several ranks under mpirun (docs/distributed.md): each loads (or, with a budget, streams within
// its own) and computes only its own experts; every rank decodes the same ids, rank 0 alone prints
// and writes the files (the trace and the DOT dump too: rank 0's graph).
Decoder& load_model(GenerateOptions& o, const RunContext& ctx, ranks::Comm& comm,
                    std::optional<ranks::RankExperts>& experts, std::optional<Decoder>& decoder) {
  if (comm.size() > 1) {
    experts.emplace(comm);
    o.dec.experts = &*experts;
    o.dec.ranks = comm.size();
    if (comm.rank() != 0) {
      o.out_path = o.dump_logits = o.save_state = std::nullopt;
      o.dec.stream.trace.clear();
      o.dec.stream.graph_dot.clear();
      o.dec.stream.routing_trace.clear();
    }
  }
  ranks::on_every_rank(comm, "could not load its slice", [&] { decoder.emplace(o.dec, ctx.cfg); });
  Decoder& dec = *decoder;
  if (o.spec > 0)
    std::printf(
        "speculative journal: %s for a pass of %d rows (KDA state on entry + each row's recurrence "
        "inputs)\n",
        human_bytes(double(dec.journal_bytes(size_t(o.spec) + 1))).c_str(), o.spec + 1);
  return dec;
}

// The saved state (--load-state), then the prompt, pending.
void feed_prompt(const GenerateOptions& o, Decoder& dec, const std::vector<int32_t>& prompt, bool saved) {
  if (saved) {
    const double t0 = now_seconds();
    dec.load(*o.load_state);
    std::printf("restored %zu positions from %s in %.2f s\n", dec.seq().size() - dec.pending(),
                o.load_state->c_str(), now_seconds() - t0);
  }
  dec.push(prompt);
  if (o.gen > 0 && dec.pending() == 0)
    throw io::usage_error(
        "--load-state: nothing to feed (the saved state has no pending token and --ids is empty)");
}

// --spec-oracle IDS (a measurement flag): drafts the known answer -- what a plain run generated --
// instead of looking it up, so every draft is accepted: the upper bound of --spec on a checkpoint
// that never repeats itself (perf/spec_bench.sh; a synthetic one has random weights).
DraftFn oracle_drafter(const GenerateOptions& o, const Decoder& dec) {
  if (!o.spec_oracle) return {};
  const std::vector<int32_t> answer = parse_id_list(*o.spec_oracle, "--spec-oracle", dec.config().vocab);
  const size_t start = dec.seq().size() - 1;  // the first generated id lands at start + 1
  std::printf("NOTE: drafts come from --spec-oracle (%zu ids), not from prompt lookup\n", answer.size());
  return [answer, start](std::span<const int32_t> seq, size_t n) {
    const size_t at = std::min(answer.size(), seq.size() - 1 - start);
    return std::vector<int32_t>(answer.begin() + std::ptrdiff_t(at),
                                answer.begin() + std::ptrdiff_t(std::min(answer.size(), at + n)));
  };
}

// ---- decode ----
// One pass per iteration: a plain step (one token) or, with --spec, a verify pass (1..N+1
// tokens). Each token is handled as it is emitted; a stop ends the pass there (the decoder then
// holds what plain decoding would).
class DecodeLoop {
 public:
  DecodeLoop(const GenerateOptions& o, const GenerateUsage& u, Decoder& dec,
             const std::optional<io::text::Tokenizer>& tok, TextOut& out, DraftPolicy& policy)
      : o_(o), dec_(dec), out_(out), policy_(policy), sampler_(o.sampling) {
    if (u.text_mode)
      text_.emplace(*tok, o.ignore_eos ? std::vector<int32_t>{} : io::text::end_of_turn_ids(*tok), o.stop);
    if (!u.text_mode) {
      std::printf("\n%-6s %-10s %-12s %s\n", "STEP", "TOKEN", "SECONDS", "TOK/S");
      std::printf("----------------------------------------\n");
    }
    if (u.json)
      sampler_.set_constraint(std::make_unique<stages::JsonConstraint>(
          u.json, json_token_table(*tok, dec.config().vocab, io::text::end_of_turn_ids(*tok))));
    spec.log_passes = o.spec > 0;  // the --out report's "speculative" rows
  }

  // Decodes up to --gen tokens (an interrupt, the end of the turn or a --stop string ends it sooner),
  // then ends the text (or the STEP table).
  void run() {
    const DraftFn drafter = oracle_drafter(o_, dec_);
    for (int g = 0; g < o_.gen && !stopped_;) {
      if (InterruptScope::requested()) {
        ended = "an interrupt";
        break;
      }
      const double ts = now_seconds();
      const uint64_t drafted = spec.drafted, accepted = spec.accepted;
      std::vector<int32_t> pass;
      speculative_step(
          dec_, sampler_, o_.spec, o_.gen - g, spec,
          [&](int32_t next, std::span<const float> logits) { return emit(g, pass, next, logits); }, drafter,
          &policy_);
      const double dt = now_seconds() - ts;
      t_steps += dt;
      if (g == 0) t_first = dt;
      // The report's per-token rows are per pass: a verify pass's reads belong to all its tokens.
      if (dec_.stream()) dec_.stream()->record_step(g, pass.front());
      if (!text_) print_rows(g, pass, dt, spec.drafted - drafted, spec.accepted - accepted);
      g += int(pass.size());
    }
    interrupted = InterruptScope::requested();
    if (text_) {
      out_.write(text_->finish());
      out_.write("\n");
    } else {
      std::printf("----------------------------------------\n");
    }
  }

  std::vector<float> step0_logits;
  std::vector<int32_t> generated;
  double t_steps = 0, t_first = 0;
  const char* ended = "the --gen cap";
  SpecStats spec;
  bool interrupted = false;

 private:
  // One emitted token: kept, shown as text, and checked for the end of the text; false stops.
  bool emit(int g, std::vector<int32_t>& pass, int32_t next, std::span<const float> logits) {
    if (g == 0 && pass.empty() && o_.dump_logits) step0_logits.assign(logits.begin(), logits.end());
    pass.push_back(next);
    generated.push_back(next);
    if (!text_) return true;
    const io::text::TextStream::Out piece = text_->push(next);
    out_.write(piece.text);
    if (piece.stop) {
      ended = "the end of the turn or a --stop string";
      stopped_ = true;
    } else if (sampler_.constraint() && sampler_.constraint()->done()) {
      ended = "the end of the JSON value (the vocabulary has no end-of-turn id)";
      stopped_ = true;
    }
    return !stopped_;
  }

  // The STEP table's rows of one pass (--ids): its time shared by its tokens.
  void print_rows(int g, const std::vector<int32_t>& pass, double dt, uint64_t drafted, uint64_t accepted) {
    const double per = dt / double(pass.size());
    for (size_t i = 0; i < pass.size(); ++i) {
      std::string note = i == 0 && dec_.stream() ? "   " + dec_.stream()->step_note() : "";
      if (i == 0 && drafted > 0)
        note += fmt::format("   verify: {} drafted, {} accepted, {} tokens this pass", drafted, accepted,
                            pass.size());
      std::printf("%-6d %-10d %-12.4f %.2f%s\n", g + int(i), pass[i], per, per > 0 ? 1.0 / per : 0.0,
                  note.c_str());
    }
    std::fflush(stdout);
  }

  const GenerateOptions& o_;
  Decoder& dec_;
  TextOut& out_;
  DraftPolicy& policy_;
  stages::Sampler sampler_;
  std::optional<io::text::TextStream> text_;
  bool stopped_ = false;
};

// ---- report ----
// The files written after the last step (a failed run leaves no logits file), and the run's summary.
void write_run_files(const GenerateOptions& o, Decoder& dec, const DecodeLoop& loop) {
  if (!loop.step0_logits.empty()) {
    write_file_atomic(*o.dump_logits, std::as_bytes(std::span<const float>(loop.step0_logits)));
    std::printf("wrote %s (%d float32 logits)\n", o.dump_logits->c_str(), dec.config().vocab);
  }
  if (o.save_state) {
    const uint64_t bytes = dec.save(*o.save_state);
    std::printf("wrote %s (%s, %zu positions)\n", o.save_state->c_str(), human_bytes(double(bytes)).c_str(),
                dec.seq().size() - dec.pending());
  }
}

void print_summary(const GenerateOptions& o, const GenerateUsage& u, size_t prompt_size,
                   const DecodeLoop& loop, const DraftPolicy& policy, TextOut& out) {
  const int n = int(loop.generated.size());
  std::printf(
      "%d tokens in %.3f s, %.4f s/token average (first step, with the %zu-id prompt: %.3f s); "
      "stopped by %s\n",
      n, loop.t_steps, n > 0 ? loop.t_steps / n : 0.0, prompt_size, loop.t_first, loop.ended);
  if (o.print_ids || !u.text_mode) {
    std::string ids;
    for (int32_t id : loop.generated) ids += fmt::format(" {}", id);
    if (u.text_mode)
      out.write(fmt::format("ids:{}\n", ids));
    else
      std::printf("generated ids:%s\n", ids.c_str());
  }
  const SpecStats& spec = loop.spec;
  if (o.spec > 0)
    std::printf(
        "speculative: %llu drafted, %llu accepted (acceptance %.2f); %llu passes (%llu verify) for %llu "
        "tokens: %.3f trunk passes per token\n",
        (unsigned long long)spec.drafted, (unsigned long long)spec.accepted, spec.acceptance(),
        (unsigned long long)spec.passes, (unsigned long long)spec.verifies, (unsigned long long)spec.emitted,
        spec.passes_per_token());
  if (o.spec > 0 && !o.spec_oracle)
    std::printf(
        "speculative policy: %s, matches of >= %zu ids; %llu pauses, %llu tokens decoded without drafting\n",
        u.policy.adaptive ? "adaptive" : "fixed", u.policy.min_match, (unsigned long long)policy.pauses(),
        (unsigned long long)policy.paused_tokens());
}

SpecReport spec_report(const GenerateOptions& o, const GenerateUsage& u, const SpecStats& spec,
                       const DraftPolicy& policy) {
  SpecReport sr;
  sr.drafts_per_pass = o.spec;
  sr.policy = o.spec_oracle ? "oracle" : u.policy.adaptive ? "adaptive" : "fixed";
  sr.min_match = int(u.policy.min_match);
  sr.pauses = policy.pauses();
  sr.paused_tokens = policy.paused_tokens();
  sr.drafted = spec.drafted;
  sr.accepted = spec.accepted;
  sr.passes = spec.passes;
  sr.verify_passes = spec.verifies;
  sr.emitted = spec.emitted;
  sr.pass_log.reserve(spec.pass_log.size());
  for (const SpecPass& p : spec.pass_log)
    sr.pass_log.push_back({.rows = int(p.rows),
                           .drafted = int(p.drafted),
                           .accepted = int(p.accepted),
                           .emitted = int(p.emitted),
                           .seconds = p.seconds});
  return sr;
}

// The run report (--out), after the peak RSS line; the exit code.
int report_run(const GenerateOptions& o, const GenerateUsage& u, const RunContext& ctx, Decoder& dec,
               const std::vector<int32_t>& prompt, const DecodeLoop& loop, const DraftPolicy& policy,
               double t_start) {
  const uint64_t rss = peak_rss_bytes();
  std::printf("PEAK RSS %s (quote this, not the plan)\n", human_bytes(static_cast<double>(rss)).c_str());
  const int n = int(loop.generated.size());
  RunReport r;
  r.prompt_ids = prompt;
  r.generated_ids = loop.generated;
  r.full_ids = dec.seq();
  r.layers = dec.n_layers();
  r.incremental = !dec.recompute();
  r.interrupted = loop.interrupted;
  r.seconds_per_token = n > 0 ? loop.t_steps / n : 0.0;
  r.wall_seconds = now_seconds() - t_start;
  r.peak_rss_bytes = rss;
  r.threads = ctx.threads();
  if (o.spec > 0) r.speculative = spec_report(o, u, loop.spec, policy);
  if (dec.stream()) dec.stream()->finish(r, loop.t_steps);
  if (o.out_path) {
    write_file_atomic(*o.out_path, to_json(r));
    std::printf("wrote %s\n", o.out_path->c_str());
  }
  if (loop.interrupted) {
    std::fprintf(stderr, "k3flow: generate interrupted after %d tokens; the report and trace cover them\n",
                 n);
    return interrupted_exit_code();
  }
  return 0;
}

int run_generate(GenerateOptions o) {
  const double t_start = now_seconds();
  const GenerateUsage u = check_usage(o);
  ranks::Comm& comm = ranks::world();
  const std::string prompt_text = read_prompt(o, u, comm);
  check_streamed_only(o.dec.stream);
  RunContext ctx(run_spec(o));
  TextOut out;
  if (u.text_mode) out.split_from_diagnostics();

  const std::vector<int32_t> prompt = prompt_ids(o, u, ctx, prompt_text);
  const std::optional<StateHeader> saved = size_run(o, prompt.size());
  print_run_header(o, u, ctx.cfg, prompt.size(), saved);
  std::optional<ranks::RankExperts> experts;
  std::optional<Decoder> decoder;
  Decoder& dec = load_model(o, ctx, comm, experts, decoder);
  feed_prompt(o, dec, prompt, saved.has_value());

  DraftPolicy policy(u.policy);
  DecodeLoop loop(o, u, dec, ctx.tok, out, policy);
  InterruptScope interrupts;
  loop.run();

  write_run_files(o, dec, loop);
  print_summary(o, u, prompt.size(), loop, policy, out);
  return report_run(o, u, ctx, dec, prompt, loop, policy, t_start);
}

}  // namespace

Action add_generate(CLI::App& sub) {
  auto o = std::make_shared<GenerateOptions>();
  sub.add_option("MODEL_DIR", o->dec.model_dir, "checkpoint directory (config.json + *.safetensors)")
      ->required();
  sub.add_option("--ids", o->ids, "prompt as token ids: 1,2,3 (commas and/or spaces); output is ids");
  sub.add_option("--prompt", o->prompt, "prompt text; the continuation is printed as text");
  sub.add_option("--prompt-file", o->prompt_file, "prompt text read verbatim from a file");
  sub.add_option("--tokenizer", o->tokenizer,
                 "tokenizer directory (tiktoken.model + tokenizer_config.json; default MODEL_DIR)");
  sub.add_option("--gen", o->gen,
                 "most tokens to generate (0..4096; prompt + N + 1 <= 36864); text runs stop earlier at the "
                 "end of the turn")
      ->check(CLI::Range(0, kMaxGen))
      ->capture_default_str();
  sub.add_option("--stop", o->stop, "stop before this text (repeatable; text prompts only)");
  sub.add_flag("--ignore-eos", o->ignore_eos, "do not stop at [EOS] / <|end_of_msg|>");
  sub.add_option("--json-schema", o->json_schema,
                 "constrain the output to JSON matching this schema file (a subset: docs/sampling.md)");
  sub.add_flag("--json-object", o->json_object, "constrain the output to one JSON object (any members)");
  sub.add_flag("--print-ids", o->print_ids, "after the text, print the generated ids on stdout");
  sub.add_flag("--recompute", o->dec.recompute,
               "recompute the whole sequence every token (the reference check; same bits, slower)");
  sub.add_flag("--incremental", o->incremental,
               "carry the KV cache and KDA state between tokens (the default)");
  add_sampler_flags(sub, o->sampling);
  sub.add_option("--layers", o->dec.layers,
                 "run only the first N layers, a diagnostic whose output is not the model's (0 = all)")
      ->check(CLI::NonNegativeNumber);
  sub.add_option("--out", o->out_path, "write the run report (JSON) to this file");
  sub.add_option("--dump-logits", o->dump_logits,
                 "write step 0's last-position logits to this file (vocab x float32, raw)");
  sub.add_option("--save-state", o->save_state, "write the carried state to this K3ST file after the run");
  sub.add_option("--load-state", o->load_state, "resume from a K3ST state file; the prompt continues it");
  sub.add_option("--config", o->dec.config, "config.json to use (default MODEL_DIR/config.json)");
  sub.add_option(
         "--spec", o->spec,
         "speculative decoding: verify up to N prompt-lookup drafts per pass (0..16, greedy only; the "
         "same ids and logits, fewer passes when the text repeats itself)")
      ->capture_default_str();
  sub.add_option("--spec-oracle", o->spec_oracle,
                 "measurement: draft these ids (what a plain run generated) instead of looking drafts up -- "
                 "the all-accepted upper bound of --spec");
  sub.add_option("--spec-min-match", o->spec_min_match,
                 "with --spec: draft only after a match of at least M ids (1..16; default 2)");
  sub.add_option("--spec-policy", o->spec_policy,
                 "with --spec: adaptive (the default: fewer drafts and pauses while they are rejected) or "
                 "fixed (N drafts at every match)");
  sub.add_option("--threads", o->threads, "compute threads (0 = oneTBB default)")->check(CLI::Range(0, 4096));
  add_stream_flags(sub, o->dec.stream);
  sub.add_option(
      "--routing-trace", o->dec.stream.routing_trace,
      "write the router's expert choices as int32 (layer, expert) pairs, one pass per forward call "
      "(a streamed run; replay with k3flow cache-sim, docs/routing.md)");
  sub.add_option("--bench-routing-replay", o->dec.stream.routing_replay,
                 "passed by bench --routing-replay to its runs: the router's top-k taken from this routing "
                 "trace (the logits are not the model's)")
      ->group("");  // not a user flag: bench's
  return [o] { return run_generate(*o); };
}

}  // namespace k3::pipeline
