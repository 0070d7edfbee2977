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
#include "pipeline/run/model_tokenizer.hpp"
#include "pipeline/run/run_report.hpp"
#include "pipeline/run/sampler_flags.hpp"
#include "pipeline/run/speculative.hpp"
#include "pipeline/run/thread_limit.hpp"
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

int run_generate(GenerateOptions o) {
  const double t_start = now_seconds();
  // ---- usage checks that need no files ----
  const int sources = (o.ids ? 1 : 0) + (o.prompt ? 1 : 0) + (o.prompt_file ? 1 : 0);
  if (sources != 1)
    throw io::usage_error(
        fmt::format("exactly one of --ids, --prompt, --prompt-file is required ({} given)", sources));
  const bool text_mode = !o.ids;
  stages::validate(o.sampling);
  if (o.dump_logits && o.gen == 0) throw io::usage_error("--dump-logits needs --gen >= 1 (it dumps step 0)");
  if (o.incremental && o.dec.recompute)
    throw io::usage_error("--incremental and --recompute exclude each other");
  check_spec_flag(o.spec, o.sampling, o.dec.recompute);
  const DraftPolicyOptions policy_opts = spec_policy_options(o.spec, o.spec_min_match, o.spec_policy);
  o.dec.stream.spec = o.spec;  // a streamed run's plan holds the verify pass's journal
  if (o.spec_oracle && o.spec == 0) throw io::usage_error("--spec-oracle needs --spec N (N >= 1)");
  if (!o.stop.empty() && !text_mode)
    throw io::usage_error("--stop needs a text prompt (--prompt / --prompt-file)");
  // JSON output: the schema is compiled (and refused, naming the keyword) before any model file is read.
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
  // The vocabulary is known only once config.json is read (checked below); --load-state may
  // resume with no new ids.
  const std::vector<int32_t> given_ids =
      text_mode ? std::vector<int32_t>{} : parse_id_list(*o.ids, "--ids", 0, o.load_state.has_value());
  // Under mpirun rank 0 reads the prompt and sends it to the others (docs/distributed.md).
  ranks::Comm& comm = ranks::world();
  std::string prompt_text;
  ranks::on_every_rank(comm, "could not read the prompt", [&] {
    if (comm.rank() == 0)
      prompt_text = o.prompt ? *o.prompt : o.prompt_file ? read_prompt_file(*o.prompt_file) : "";
  });
  prompt_text = ranks::from_rank0(comm, prompt_text);
  if (!o.load_state && text_mode && prompt_text.empty()) throw io::usage_error("the prompt is empty");
  for (const auto& [flag, value] : {std::pair{"--trace", o.dec.stream.trace},
                                    {"--graph-dot", o.dec.stream.graph_dot},
                                    {"--routing-trace", o.dec.stream.routing_trace},
                                    {"--bench-routing-replay", o.dec.stream.routing_replay}})
    if (!value.empty() && !o.dec.stream.requested())
      throw io::usage_error(fmt::format(
          "{} shows a streamed run: add a budget (--mem-gb, --preset, --trunk-gb + --cache-gb) or --trunk",
          flag));
  check_stream_flags(o.dec.stream);
  // Every path is checked before the first read: a typo must not throw a long run away.
  check_model_dir(o.dec.model_dir, o.dec.config.has_value());
  if (o.dec.config) check_input_file(*o.dec.config, "--config");
  if (o.tokenizer) check_input_dir(*o.tokenizer, "--tokenizer");
  if (o.load_state) check_input_file(*o.load_state, "--load-state");
  if (!o.dec.stream.trunk_dir.empty()) check_trunk_dir(o.dec.stream.trunk_dir);
  for (const auto& [flag, path] :
       {std::pair{"--out", o.out_path}, {"--dump-logits", o.dump_logits}, {"--save-state", o.save_state}})
    if (path) check_writable(*path, flag);
  if (!o.dec.stream.trace.empty()) check_writable(o.dec.stream.trace, "--trace");
  if (!o.dec.stream.graph_dot.empty()) check_writable(o.dec.stream.graph_dot, "--graph-dot");
  if (!o.dec.stream.routing_trace.empty()) check_writable(o.dec.stream.routing_trace, "--routing-trace");
  if (!o.dec.stream.routing_replay.empty())
    check_input_file(o.dec.stream.routing_replay, "--bench-routing-replay");

  TextOut out;
  if (text_mode) out.split_from_diagnostics();

  const ThreadLimit threads(o.threads);
  o.dec.stream.threads = threads.threads();

  // ---- config, tokenizer, prompt ids ----
  io::ModelConfig cfg = load_model_config(o.dec.model_dir, o.dec.config);
  if (o.dec.layers > cfg.n_layers)
    throw io::usage_error(fmt::format("--layers {}: the model has {} layers", o.dec.layers, cfg.n_layers));
  std::printf("%s\n", cfg.summary().c_str());
  const std::optional<io::text::Tokenizer> tok = model_tokenizer(
      o.dec.model_dir, o.tokenizer, cfg, text_mode ? (o.prompt ? "--prompt" : "--prompt-file") : nullptr);
  std::vector<int32_t> prompt = text_mode ? tok->encode(prompt_text, true) : given_ids;
  if (prompt.empty() && !o.load_state)
    throw io::usage_error(text_mode ? "the prompt is empty" : "--ids: no token ids given");
  if (!text_mode) check_ids_in_vocab(prompt, cfg.vocab, "--ids");

  // ---- resume header before anything is sized ----
  std::optional<StateHeader> saved;
  if (o.load_state) {
    saved = peek_state(*o.load_state);
    check_saved_positions(*o.load_state, *saved);
  }
  const size_t prior = saved ? static_cast<size_t>(saved->nseq) : 0;
  o.dec.capacity = prior + prompt.size() + static_cast<size_t>(o.gen) + 1;
  if (o.dec.capacity > kMaxPositions) {
    const std::string from_state =
        saved ? fmt::format("{} saved positions in {} + ", prior, *o.load_state) : std::string();
    throw io::usage_error(fmt::format("{}prompt + --gen + 1 = {} positions exceeds the {} this build allows",
                                      from_state, o.dec.capacity, kMaxPositions));
  }
  o.dec.expected_calls = o.gen;
  run_capacity(o.dec);  // a --context below what the run needs is refused before the header

  std::printf("\nKimi K3, k3flow, released checkpoint layout\n");
  std::printf("  model   : %s\n", o.dec.model_dir.c_str());
  if (saved)
    std::printf("  prompt  : %zu saved + %zu new ids\n", prior, prompt.size());
  else
    std::printf("  prompt  : %zu ids\n", prompt.size());
  std::printf("  decode  : %s, %s, up to %d tokens, threads %s\n", describe_sampling(o.sampling).c_str(),
              o.dec.recompute ? "full recompute" : "incremental (KV cache + carried KDA state)", o.gen,
              o.threads > 0 ? std::to_string(o.threads).c_str() : "default");
  if (json)
    std::printf(
        "  output  : JSON, %s\n",
        o.json_schema ? fmt::format("matching the schema in {}", *o.json_schema).c_str() : "one object");
  if (o.spec > 0)
    std::printf(
        "  spec    : up to %d prompt-lookup drafts verified per pass (greedy, same ids and logits); %s "
        "policy, matches of >= %zu ids\n",
        o.spec, policy_opts.adaptive ? "adaptive" : "fixed", policy_opts.min_match);
  if (o.dec.layers > 0 && o.dec.layers < cfg.n_layers)
    std::printf(
        "  NOTE    : --layers %d runs only the first %d of %d layers; the output is not the model's\n",
        o.dec.layers, o.dec.layers, cfg.n_layers);

  // Several ranks under mpirun (docs/distributed.md): each loads (or, with a budget, streams within
  // its own) and computes only its own experts; every rank decodes the same ids, rank 0 alone prints
  // and writes the files (the trace and the DOT dump too: rank 0's graph).
  std::optional<ranks::RankExperts> experts;
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
  std::optional<Decoder> decoder;
  ranks::on_every_rank(comm, "could not load its slice", [&] { decoder.emplace(o.dec, std::move(cfg)); });
  Decoder& dec = *decoder;
  const io::ModelConfig& c = dec.config();
  if (o.spec > 0)
    std::printf(
        "speculative journal: %s for a pass of %d rows (KDA state on entry + each row's recurrence "
        "inputs)\n",
        human_bytes(double(dec.journal_bytes(size_t(o.spec) + 1))).c_str(), o.spec + 1);
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

  // ---- decode ----
  std::optional<io::text::TextStream> text;
  if (text_mode)
    text.emplace(*tok, o.ignore_eos ? std::vector<int32_t>{} : io::text::end_of_turn_ids(*tok), o.stop);
  if (!text_mode) {
    std::printf("\n%-6s %-10s %-12s %s\n", "STEP", "TOKEN", "SECONDS", "TOK/S");
    std::printf("----------------------------------------\n");
  }
  stages::Sampler sampler(o.sampling);
  if (json)
    sampler.set_constraint(std::make_unique<stages::JsonConstraint>(
        json, json_token_table(*tok, c.vocab, io::text::end_of_turn_ids(*tok))));
  InterruptScope interrupts;
  std::vector<float> step0_logits;
  std::vector<int32_t> generated;
  double t_steps = 0, t_first = 0;
  const char* ended = "the --gen cap";
  // One pass per iteration: a plain step (one token) or, with --spec, a verify pass (1..N+1
  // tokens). Each token is handled as it is emitted; a stop ends the pass there (the decoder then
  // holds what plain decoding would).
  SpecStats spec;
  spec.log_passes = o.spec > 0;  // the --out report's "speculative" rows
  bool stopped = false;
  // --spec-oracle IDS (a measurement flag): drafts the known answer -- what a plain run generated --
  // instead of looking it up, so every draft is accepted: the upper bound of --spec on a checkpoint
  // that never repeats itself (perf/spec_bench.sh; a synthetic one has random weights).
  DraftFn drafter;
  DraftPolicy policy(policy_opts);
  if (o.spec_oracle) {
    const std::vector<int32_t> answer = parse_id_list(*o.spec_oracle, "--spec-oracle", c.vocab);
    const size_t start = dec.seq().size() - 1;  // the first generated id lands at start + 1
    drafter = [answer, start](std::span<const int32_t> seq, size_t n) {
      const size_t at = std::min(answer.size(), seq.size() - 1 - start);
      return std::vector<int32_t>(answer.begin() + std::ptrdiff_t(at),
                                  answer.begin() + std::ptrdiff_t(std::min(answer.size(), at + n)));
    };
    std::printf("NOTE: drafts come from --spec-oracle (%zu ids), not from prompt lookup\n", answer.size());
  }
  for (int g = 0; g < o.gen && !stopped;) {
    if (InterruptScope::requested()) {
      ended = "an interrupt";
      break;
    }
    const double ts = now_seconds();
    const uint64_t drafted = spec.drafted, accepted = spec.accepted;
    std::vector<int32_t> pass;
    speculative_step(
        dec, sampler, o.spec, o.gen - g, spec,
        [&](int32_t next, std::span<const float> logits) {
          if (g == 0 && pass.empty() && o.dump_logits) step0_logits.assign(logits.begin(), logits.end());
          pass.push_back(next);
          generated.push_back(next);
          if (!text) return true;
          const io::text::TextStream::Out piece = text->push(next);
          out.write(piece.text);
          if (piece.stop) {
            ended = "the end of the turn or a --stop string";
            stopped = true;
          } else if (sampler.constraint() && sampler.constraint()->done()) {
            ended = "the end of the JSON value (the vocabulary has no end-of-turn id)";
            stopped = true;
          }
          return !stopped;
        },
        drafter, &policy);
    const double dt = now_seconds() - ts;
    t_steps += dt;
    if (g == 0) t_first = dt;
    // The report's per-token rows are per pass: a verify pass's reads belong to all its tokens.
    if (dec.stream()) dec.stream()->record_step(g, pass.front());
    if (!text) {
      const double per = dt / double(pass.size());
      for (size_t i = 0; i < pass.size(); ++i) {
        std::string note = i == 0 && dec.stream() ? "   " + dec.stream()->step_note() : "";
        if (i == 0 && spec.drafted > drafted)
          note += fmt::format("   verify: {} drafted, {} accepted, {} tokens this pass",
                              spec.drafted - drafted, spec.accepted - accepted, pass.size());
        std::printf("%-6d %-10d %-12.4f %.2f%s\n", g + int(i), pass[i], per, per > 0 ? 1.0 / per : 0.0,
                    note.c_str());
      }
      std::fflush(stdout);
    }
    g += int(pass.size());
  }
  const bool interrupted = InterruptScope::requested();
  if (text) {
    out.write(text->finish());
    out.write("\n");
  } else {
    std::printf("----------------------------------------\n");
  }
  // Written after the last step: a failed run leaves no logits file.
  if (!step0_logits.empty()) {
    write_file_atomic(*o.dump_logits, std::as_bytes(std::span<const float>(step0_logits)));
    std::printf("wrote %s (%d float32 logits)\n", o.dump_logits->c_str(), c.vocab);
  }
  if (o.save_state) {
    const uint64_t bytes = dec.save(*o.save_state);
    std::printf("wrote %s (%s, %zu positions)\n", o.save_state->c_str(), human_bytes(double(bytes)).c_str(),
                dec.seq().size() - dec.pending());
  }
  const int n = int(generated.size());
  const double spt = n > 0 ? t_steps / n : 0.0;
  std::printf(
      "%d tokens in %.3f s, %.4f s/token average (first step, with the %zu-id prompt: %.3f s); "
      "stopped by %s\n",
      n, t_steps, spt, prompt.size(), t_first, ended);
  if (o.print_ids || !text_mode) {
    std::string ids;
    for (int32_t id : generated) ids += fmt::format(" {}", id);
    if (text_mode)
      out.write(fmt::format("ids:{}\n", ids));
    else
      std::printf("generated ids:%s\n", ids.c_str());
  }
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
        policy_opts.adaptive ? "adaptive" : "fixed", policy_opts.min_match,
        (unsigned long long)policy.pauses(), (unsigned long long)policy.paused_tokens());
  const uint64_t rss = peak_rss_bytes();
  std::printf("PEAK RSS %s (quote this, not the plan)\n", human_bytes(static_cast<double>(rss)).c_str());

  RunReport r;
  r.prompt_ids = prompt;
  r.generated_ids = generated;
  r.full_ids = dec.seq();
  r.layers = dec.n_layers();
  r.incremental = !dec.recompute();
  r.interrupted = interrupted;
  r.seconds_per_token = spt;
  r.wall_seconds = now_seconds() - t_start;
  r.peak_rss_bytes = rss;
  r.threads = threads.threads();
  if (o.spec > 0) {
    SpecReport& sr = r.speculative.emplace();
    sr.drafts_per_pass = o.spec;
    sr.policy = o.spec_oracle ? "oracle" : policy_opts.adaptive ? "adaptive" : "fixed";
    sr.min_match = int(policy_opts.min_match);
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
  }
  if (dec.stream()) dec.stream()->finish(r, t_steps);
  if (o.out_path) {
    write_file_atomic(*o.out_path, to_json(r));
    std::printf("wrote %s\n", o.out_path->c_str());
  }
  if (interrupted) {
    std::fprintf(stderr, "k3flow: generate interrupted after %d tokens; the report and trace cover them\n",
                 n);
    return interrupted_exit_code();
  }
  return 0;
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
