// `k3flow chat MODEL_DIR`: a conversation with the model in K3's XTML chat format
// (io/text/xtml.hpp). The model's state (KV cache, KDA state) is carried from turn to turn, so a
// turn costs only its own tokens, never a re-prefill of the history.
//   stdin a terminal: a prompt, the reply streamed as it is generated, then its tokens/s and bytes
//                     read; /save F, /load F, /reset, /quit, /help. Ctrl-C stops the reply, not
//                     the session; SIGTERM ends it (exit 143, --save-state still written).
//   stdin a pipe:     one user message per line (the same commands), each reply printed as one
//                     block followed by a newline: scriptable and testable. --jsonl prints each
//                     reply as one JSON object on one line instead, whatever newlines it holds.
// On a terminal the reply's control characters are shown escaped (support/terminal_text.hpp); to a
// file or a pipe it is written as generated.
// The think channel is generated but hidden unless --show-thinking.
// --tools F.json declares functions: a reply's calls are printed as `tool call ID: NAME ARGUMENTS`
// lines (escaped on a terminal like the reply; with --jsonl in the turn's record instead), and
// `/tool RESULT` answers them in order; after the last answer the model replies.
// Under mpirun (docs/distributed.md §6) rank 0 owns the terminal and the files: it reads each line
// and sends it, with Ctrl-C / SIGTERM as a flag before every step, and the other ranks follow, each
// holding only its experts; every rank samples the same ids, so nothing else is sent.
#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "io/env.hpp"
#include "io/error.hpp"
#include "io/json_text.hpp"
#include "io/text/chat_history.hpp"
#include "io/text/text_stream.hpp"
#include "io/text/xtml.hpp"
#include "pipeline/cli/commands.hpp"
#include "pipeline/ranks/comm.hpp"
#include "pipeline/ranks/rank_experts.hpp"
#include "pipeline/run/decoder.hpp"
#include "pipeline/run/draft_policy.hpp"
#include "pipeline/run/run_context.hpp"
#include "pipeline/run/sampler_flags.hpp"
#include "pipeline/run/speculative.hpp"
#include "pipeline/support/clock.hpp"
#include "pipeline/support/human_bytes.hpp"
#include "pipeline/support/interrupt.hpp"
#include "pipeline/support/output_file.hpp"
#include "pipeline/support/terminal_text.hpp"

namespace k3::pipeline {

namespace {

namespace text = io::text;
using Role = text::ChatMessage::Role;

struct ChatArgs {
  DecoderOptions dec;
  std::optional<std::string> tokenizer, system, history, save_state, tools;
  bool show_thinking = false, no_thinking = false, jsonl = false;
  std::string effort = "max";
  std::string tools_json;  // --tools F: its text
  int max_reply = 1024;
  size_t context = 4096;
  int threads = 0;
  int spec = 0;  // --spec: drafts per verify pass (0: off)
  std::optional<int> spec_min_match;
  std::optional<std::string> spec_policy;
  DraftPolicyOptions draft;  // from --spec, --spec-min-match, --spec-policy
  stages::SamplerOptions sampling;
};

// One line from stdin without the trailing newline; nullopt at end of input. A signal while
// waiting (Ctrl-C at the prompt) returns an empty line with `interrupted` set.
std::optional<std::string> read_line(bool& interrupted) {
  std::string line;
  interrupted = false;
  for (;;) {
    char ch;
    const ssize_t n = ::read(STDIN_FILENO, &ch, 1);
    if (n < 0 && errno == EINTR) {
      interrupted = true;
      return std::string();
    }
    if (n <= 0) return line.empty() ? std::nullopt : std::optional(line);
    if (ch == '\n') {
      if (!line.empty() && line.back() == '\r') line.pop_back();  // a CRLF line end
      return line;
    }
    line += ch;
  }
}

class ChatSession {
 public:
  ChatSession(ChatArgs& a, Decoder& dec, const text::Tokenizer& tok)
      : a_(a),
        dec_(dec),
        tok_(tok),
        sampler_(a.sampling),
        policy_(a.draft),
        comm_(ranks::world()),
        lead_(comm_.rank() == 0),
        interactive_(lead_ && ::isatty(STDIN_FILENO) != 0) {
    opts_.thinking = !a.no_thinking;
    opts_.effort = a.effort;
    opts_.tools = a.tools_json;
    end_ids_ = text::end_of_turn_ids(tok);
  }

  void restore(std::vector<text::ChatMessage> history) {
    history_ = std::move(history);
    std::optional<std::string> system;
    if (!history_.empty() && history_.front().role == Role::system) system = history_.front().content;
    if (a_.system) {
      if (system && *system != *a_.system)
        throw io::usage_error("--system differs from the system message of the --history file");
      if (!system) history_.insert(history_.begin(), {Role::system, *a_.system, std::nullopt});
    }
    if (!history_.empty() && history_.back().role == Role::user)
      throw io::usage_error("--history: the conversation ends with a user message that has no reply");
    // The history is fed once, as a full render; every later turn only appends to it.
    push(text::render(history_, false, opts_));
  }

  void run() {
    // Ctrl-C interrupts the reply being generated, or the line being typed; never the session.
    InterruptScope interrupts;
    if (interactive_)
      std::fprintf(stderr,
                   "k3flow chat: type a message, /help for commands; Ctrl-C stops a reply, Ctrl-D or /quit "
                   "leaves\n");
    for (;;) {
      if (interactive_) {
        std::fputs("\n> ", stdout);
        std::fflush(stdout);
      }
      bool interrupted = false;
      std::optional<std::string> line;
      if (lead_) {
        line = read_line(interrupted);
        term_ = terminated();
      }
      if (comm_.size() > 1) share_input(line, interrupted);
      if (term_) break;
      InterruptScope::clear();
      if (interrupted) {
        if (interactive_) std::fputs("\n(Ctrl-D or /quit leaves)", stdout);
        continue;
      }
      if (!line) break;
      if (line->empty()) continue;
      if ((*line)[0] == '/') {
        if (!command(*line)) break;
        continue;
      }
      turn(*line);
      if (comm_.size() > 1 ? term_ : terminated()) break;  // several ranks: only what they agreed
    }
    if (interactive_) std::fputs("\n", stdout);
  }

  // SIGTERM ends the session (Ctrl-C only the reply); the signal stays recorded for the exit code.
  static bool terminated() { return InterruptScope::signal_number() == SIGTERM; }

 private:
  // Several ranks: rank 0's line (or end of input, Ctrl-C, SIGTERM) on every rank.
  void share_input(std::optional<std::string>& line, bool& interrupted) {
    const std::string mine = !lead_        ? std::string()
                             : term_       ? std::string("T")
                             : interrupted ? std::string("I")
                             : !line       ? std::string("E")
                                           : "L" + *line;
    const std::string got = ranks::from_rank0(comm_, mine, ranks::kRank0Console);
    term_ = got == "T";
    interrupted = got == "I";
    line = got.empty() || got[0] != 'L' ? std::nullopt : std::optional(got.substr(1));
  }

  // Encodes segments (control ones with specials allowed) and appends them to the sequence.
  void push(const std::vector<text::Segment>& segments) {
    std::vector<int32_t> ids;
    for (const text::Segment& s : segments) {
      const std::vector<int32_t> part = tok_.encode(s.text, s.control);
      ids.insert(ids.end(), part.begin(), part.end());
    }
    if (ids.size() > dec_.room())
      throw io::usage_error(
          fmt::format("chat: the conversation needs {} more positions but the context has {} "
                      "left (--context {}); /reset or raise --context",
                      ids.size(), dec_.room(), a_.context));
    dec_.push(ids);
  }

  bool command(const std::string& line) {
    const size_t sp = line.find(' ');
    const std::string cmd = line.substr(0, sp), arg = sp == std::string::npos ? "" : line.substr(sp + 1);
    try {
      if (cmd == "/quit" || cmd == "/exit") return false;
      if (cmd == "/help") {
        say("/save F  state to F (K3ST) and the conversation to F.history.jsonl\n"
            "/load F  continue from what /save F wrote\n/reset   forget the conversation (keeps --system)\n"
            "/tool R  with --tools: R answers the reply's next tool call\n/quit    leave");
      } else if (cmd == "/tool") {
        tool_result(arg);
      } else if (cmd == "/reset") {
        pending_.clear();
        answered_ = 0;
        std::vector<text::ChatMessage> keep;
        if (!history_.empty() && history_.front().role == Role::system) keep.push_back(history_.front());
        dec_.reset();
        restore(std::move(keep));
        say("conversation reset");
      } else if (cmd == "/load" && comm_.size() > 1) {
        say("/load is not available under mpirun (each rank would read its own disk); start with --history "
            "and --load-state instead");
      } else if (cmd == "/save" && !arg.empty() && !lead_) {
        // rank 0 alone writes the files
      } else if ((cmd == "/save" || cmd == "/load") && !opts_.tools.empty()) {
        say(fmt::format("{} is not available with --tools (the history file holds no tool calls)", cmd));
      } else if (cmd == "/save" && !arg.empty()) {
        check_writable(arg, "/save");
        const uint64_t bytes = dec_.save(arg);
        text::save_history(arg + ".history.jsonl", history_);
        say(fmt::format("saved {} ({}, {} positions) and {}.history.jsonl", arg, human_bytes(double(bytes)),
                        dec_.seq().size(), arg));
      } else if (cmd == "/load" && !arg.empty()) {
        if (!std::filesystem::exists(arg + ".history.jsonl"))
          throw io::usage_error(
              fmt::format("/load {}: no {}.history.jsonl beside it (written by /save)", arg, arg));
        std::vector<text::ChatMessage> h = text::load_history(arg + ".history.jsonl");
        dec_.load(arg);
        history_ = std::move(h);
        say(fmt::format("loaded {} ({} positions, {} messages)", arg, dec_.seq().size(), history_.size()));
      } else {
        say(fmt::format("unknown command '{}' (/help lists them)", line));
      }
    } catch (const io::Error& e) {
      // A bad command argument ends the command, not the conversation.
      if (lead_) std::fprintf(stderr, "k3flow: %s\n", e.what());
    }
    return true;
  }

  // Diagnostics on stderr: rank 0's alone under mpirun (the others' stdout is closed already).
  void say(const std::string& s) {
    if (lead_) std::fprintf(stderr, "%s\n", s.c_str());
  }

  void turn(const std::string& user) {
    if (!pending_.empty()) {
      say(fmt::format("k3flow: the reply's tool calls wait for their results: /tool RESULT answers {} ({})",
                      pending_.front().id, pending_.front().name));
      return;
    }
    const text::ChatMessage msg{Role::user, user, std::nullopt};
    const size_t before = dec_.seq().size();
    try {
      push(text::render_turn(msg, opts_));
    } catch (const io::Error& e) {
      say(fmt::format("k3flow: {}", e.what()));
      return;
    }
    history_.push_back(msg);
    reply(before);
  }

  // `/tool RESULT`: the next unanswered call's result; after the last one, the model's reply.
  void tool_result(const std::string& result) {
    if (pending_.empty()) {
      say("k3flow: no tool call is waiting for a result");
      return;
    }
    text::ChatMessage msg{Role::tool, result};
    msg.tool_call_id = pending_.front().id;
    msg.name = pending_.front().name;
    const size_t before = dec_.seq().size();
    push(text::render_tool_result(msg, ++answered_));
    history_.push_back(msg);
    pending_.erase(pending_.begin());
    if (!pending_.empty()) return;
    push(text::render_generation_prompt(opts_));
    reply(before);
  }

  // Generates the reply to what was just pushed (from `before` on: the prompt's ids).
  void reply(size_t before) {
    const size_t prompt_ids = dec_.seq().size() - before;
    text::ReplyParser parser(opts_.thinking);
    text::StreamDecoder decoder(tok_);
    const uint64_t bytes0 = dec_.stream() ? dec_.stream()->bytes_read() : 0;
    const double t0 = now_seconds();
    double t_first = 0;
    int n = 0;
    bool in_thinking_block = false;
    const char* ended = "the --max-reply cap";
    InterruptScope::clear();
    // One pass per iteration: one token, or with --spec a verify pass of up to N + 1 (a reply's
    // end mid-pass keeps only the rows before it, as plain decoding would have fed).
    bool over = false;
    sampler_.start_reply(dec_.seq().size());  // the penalties count this reply's ids only
    // Test hook (io/env.hpp): the reply's first text, as if generated -- its ids into the state, its
    // text through the parser. A reply it completes generates nothing more.
    if (const auto given = io::env::text(io::env::kTestChatReply)) {
      push({text::Segment{std::string(*given), true}});
      show(parser.feed(*given), in_thinking_block);
      over = parser.state() == text::ReplyParser::State::done ||
             parser.state() == text::ReplyParser::State::malformed;
    }
    while (n < a_.max_reply && !over) {
      // Ctrl-C or SIGTERM, as rank 0 saw it (one byte to every rank under mpirun: all stop together).
      char stop = lead_ && InterruptScope::requested() ? (terminated() ? 'T' : 'C') : 0;
      if (comm_.size() > 1) stop = ranks::byte_from_rank0(comm_, stop);
      if (stop) {
        ended = stop == 'T' ? "SIGTERM" : "Ctrl-C";
        term_ = stop == 'T';
        break;
      }
      if (dec_.room() == 0) {
        ended = "a full context";
        break;
      }
      const int most = int(std::min<size_t>(size_t(a_.max_reply - n), dec_.room()));
      speculative_step(
          dec_, sampler_, a_.spec, most, spec_,
          [&](int32_t id, std::span<const float>) {
            if (n == 0) t_first = now_seconds() - t0;
            show(parser.feed(decoder.push(id)), in_thinking_block);
            const auto st = parser.state();
            over = st == text::ReplyParser::State::done || st == text::ReplyParser::State::malformed ||
                   std::find(end_ids_.begin(), end_ids_.end(), id) != end_ids_.end();
            if (!over) ++n;  // as before: the token that ends the reply is not counted
            return !over;
          },
          {}, &policy_);
    }
    show(parser.feed(decoder.finish()), in_thinking_block);
    show(parser.finish(), in_thinking_block);
    if (!a_.jsonl) {
      if (in_thinking_block) std::fputs("\n</think>\n", stdout);
      std::fputs("\n", stdout);
      std::fflush(stdout);
    }
    close_reply(parser);
    if (parser.state() == text::ReplyParser::State::done) ended = "the end of the turn";
    if (parser.state() == text::ReplyParser::State::malformed) ended = "a reply that left the chat format";
    if (parser.state() == text::ReplyParser::State::malformed)
      say(fmt::format("k3flow: the reply left the chat format ({}); it was closed there", parser.error()));

    text::ChatMessage answer = parser.message();
    // The calls get ids the results will name; they wait for /tool. With --jsonl they are in the
    // turn's record; otherwise a line each, the model's name and arguments escaped as its reply is.
    for (text::ToolCall& c : answer.tool_calls) {
      c.id = fmt::format("call_{}", ++calls_made_);
      if (lead_ && !a_.jsonl) {
        write_text(fmt::format("tool call {}: {} {}", c.id, c.name, c.arguments));
        std::fputs("\n", stdout);
      }
    }
    std::fflush(stdout);
    pending_ = answer.tool_calls;
    answered_ = 0;
    history_.push_back(std::move(answer));
    if (a_.history && lead_) text::save_history(*a_.history, history_);
    if (!lead_) return;
    if (a_.jsonl) record(n, ended, pending_);
    const double dt = now_seconds() - t0;
    const uint64_t bytes = dec_.stream() ? dec_.stream()->bytes_read() - bytes0 : 0;
    std::fprintf(
        stderr,
        "[%d tokens in %.2f s, %.2f tokens/s after a %.2f s first step (%zu prompt ids)%s; stopped by %s]\n",
        n, dt, n > 1 && dt > t_first ? (n - 1) / (dt - t_first) : 0.0, t_first, prompt_ids,
        dec_.stream() ? fmt::format(", read {}", human_bytes(double(bytes))).c_str() : "", ended);
    if (a_.spec > 0)
      std::fprintf(stderr,
                   "[speculative so far: %llu drafted, %llu accepted; %.3f trunk passes per token; %llu "
                   "pauses, %llu tokens without drafting]\n",
                   (unsigned long long)spec_.drafted, (unsigned long long)spec_.accepted,
                   spec_.passes_per_token(), (unsigned long long)policy_.pauses(),
                   (unsigned long long)policy_.paused_tokens());
  }

  void show(const text::ReplyText& t, bool& in_thinking_block) {
    if (a_.jsonl) {  // one record at the end of the turn
      reply_ += t.reply;
      reasoning_ += t.reasoning;
      return;
    }
    if (a_.show_thinking && !t.reasoning.empty()) {
      if (!in_thinking_block) std::fputs("<think>\n", stdout);
      in_thinking_block = true;
      write_text(t.reasoning);
    }
    if (!t.reply.empty()) {
      if (in_thinking_block) std::fputs("\n</think>\n", stdout);
      in_thinking_block = false;
      write_text(t.reply);
    }
    std::fflush(stdout);
  }

  void write_text(const std::string& s) {
    const std::string shown = escape_ ? terminal_escaped(s) : s;
    std::fwrite(shown.data(), 1, shown.size(), stdout);
  }

  // --jsonl: the turn as one line, {"reply","reasoning","tokens","stopped_by"} and, when the reply
  // made calls, "tool_calls" in the API's shape ([{"id","type":"function","function":{"name",
  // "arguments"}}]); JSON escapes every control character, so a terminal shows it safely too.
  void record(int tokens, const char* stopped_by, const std::vector<text::ToolCall>& calls) {
    io::JsonWriter w;
    w.begin_object()
        .field("reply", reply_)
        .field("reasoning", reasoning_)
        .field("tokens", tokens)
        .field("stopped_by", stopped_by);
    if (!calls.empty()) {
      w.key("tool_calls").begin_array();
      for (const text::ToolCall& c : calls) {
        w.begin_object().field("id", c.id).field("type", "function");
        w.key("function").begin_object().field("name", c.name).field("arguments", c.arguments).end_object();
        w.end_object();
      }
      w.end_array();
    }
    w.end_object();
    std::printf("%s\n", w.str().c_str());
    std::fflush(stdout);
    reply_.clear();
    reasoning_.clear();
  }

  // A reply cut short (the cap, Ctrl-C, a full context, a malformed reply) still leaves a whole
  // message in the state: the parser knows what closes it (the rest of a cut marker included).
  void close_reply(const text::ReplyParser& p) {
    try {
      push(p.closing());
    } catch (const io::Error&) {
      // No room to close it: the next turn reports the full context.
    }
  }

  ChatArgs& a_;
  Decoder& dec_;
  const text::Tokenizer& tok_;
  stages::Sampler sampler_;
  SpecStats spec_;
  DraftPolicy policy_;  // carried across replies
  ranks::Comm& comm_;
  const bool lead_;  // rank 0 (or the only process): reads stdin, prints, writes files
  bool interactive_;
  bool term_ = false;                        // SIGTERM ended the session (several ranks: as rank 0 saw it)
  const bool escape_ = is_terminal(stdout);  // control characters shown escaped
  std::string reply_, reasoning_;            // --jsonl: the turn's text so far
  text::ChatOptions opts_;
  std::vector<int32_t> end_ids_;
  std::vector<text::ChatMessage> history_;
  std::vector<text::ToolCall> pending_;  // the last reply's calls without a result yet
  size_t answered_ = 0;                  // results given to the last reply's calls
  uint64_t calls_made_ = 0;
};

// --tools F: the file's text, a JSON array of OpenAI tool objects (usage error naming the flag).
std::string read_tools_file(const std::string& path) {
  check_input_file(path, "--tools");
  std::ifstream f(path, std::ios::binary);
  if (!f) throw io::usage_error(fmt::format("--tools {}: cannot be read", path));
  std::ostringstream s;
  s << f.rdbuf();
  text::validate_tools(s.str(), fmt::format("--tools {}", path));
  return s.str();
}

// ---- usage checks ----
void check_usage(ChatArgs& a) {
  text::ChatOptions opts{!a.no_thinking, a.effort};
  text::validate(opts);
  if (a.tools) {
    if (a.history)
      throw io::usage_error("--tools cannot be used with --history (the history file holds no tool calls)");
    a.tools_json = read_tools_file(*a.tools);
  }
  stages::validate(a.sampling);
  check_spec_flag(a.spec, a.sampling, a.dec.recompute);
  a.draft = spec_policy_options(a.spec, a.spec_min_match, a.spec_policy);
  a.dec.stream.spec = a.spec;  // a streamed run's plan holds the verify pass's journal
}

// ---- paths, threads, config: the run context ----
RunSpec run_spec(ChatArgs& a) {
  RunSpec s{.dec = a.dec, .tokenizer = a.tokenizer, .threads = a.threads};
  if (a.history) s.after_trunk.push_back({PathCheck::Kind::writable, "--history", *a.history});
  if (a.save_state) s.after_trunk.push_back({PathCheck::Kind::writable, "--save-state", *a.save_state});
  return s;
}

// ---- the model: tokenizer, history and weights ----
// Diagnostics go to stderr; stdout carries the conversation. Under mpirun only rank 0's: the others'
// stdout stays closed (ranks::Session), and each holds and computes only its experts.
Decoder& load_model(ChatArgs& a, RunContext& ctx, ranks::Comm& comm,
                    std::optional<ranks::RankExperts>& experts, std::optional<Decoder>& decoder,
                    std::vector<text::ChatMessage>& history) {
  const bool lead = comm.rank() == 0;
  if (comm.size() > 1) {
    experts.emplace(comm);
    a.dec.experts = &*experts;
    a.dec.ranks = comm.size();
    if (!lead) a.save_state = std::nullopt;
  }
  std::fflush(stdout);
  const int conversation_fd = lead ? ::dup(STDOUT_FILENO) : -1;
  if (lead) ::dup2(STDERR_FILENO, STDOUT_FILENO);
  std::printf("%s\n", ctx.cfg.summary().c_str());
  a.dec.capacity = a.context;
  a.dec.expected_calls = a.max_reply;
  ranks::on_every_rank(comm, "could not load its slice", [&] {
    ctx.load_tokenizer("chat");
    if (a.history) history = text::load_history(*a.history);
    decoder.emplace(a.dec, ctx.cfg);
  });
  std::printf("chat: %s, context %zu positions, replies up to %d tokens, thinking %s\n",
              describe_sampling(a.sampling).c_str(), a.context, a.max_reply,
              a.no_thinking ? "off" : (a.effort + (a.show_thinking ? ", shown" : ", hidden")).c_str());
  std::fflush(stdout);
  if (lead) {
    ::dup2(conversation_fd, STDOUT_FILENO);
    ::close(conversation_fd);
  }
  return *decoder;
}

// ---- after the conversation: --save-state, and how it ended ----
int end_chat(const ChatArgs& a, Decoder& dec) {
  if (a.save_state) {
    const uint64_t bytes = dec.save(*a.save_state);
    std::fprintf(stderr, "wrote %s (%s)\n", a.save_state->c_str(), human_bytes(double(bytes)).c_str());
  }
  if (InterruptScope::signal_number() == SIGTERM) {
    std::fprintf(stderr, "k3flow: chat ended by SIGTERM%s\n",
                 a.history ? fmt::format("; {} holds the conversation", *a.history).c_str() : "");
    return interrupted_exit_code();
  }
  return 0;
}

int run_chat(ChatArgs& a) {
  check_usage(a);
  RunContext ctx(run_spec(a));
  ranks::Comm& comm = ranks::world();
  std::optional<ranks::RankExperts> experts;
  std::optional<Decoder> decoder;
  std::vector<text::ChatMessage> history;
  Decoder& dec = load_model(a, ctx, comm, experts, decoder, history);
  ChatSession session(a, dec, *ctx.tok);
  session.restore(std::move(history));
  session.run();
  return end_chat(a, dec);
}

}  // namespace

Action add_chat(CLI::App& sub) {
  auto a = std::make_shared<ChatArgs>();
  sub.add_option("MODEL_DIR", a->dec.model_dir, "checkpoint directory (config.json + *.safetensors)")
      ->required();
  sub.add_option("--tokenizer", a->tokenizer, "tokenizer directory (default MODEL_DIR)");
  sub.add_option("--system", a->system, "system message");
  sub.add_option("--history", a->history,
                 "conversation JSONL: continued if it exists, rewritten after every reply");
  sub.add_flag("--show-thinking", a->show_thinking, "print the think channel (between <think> and </think>)");
  sub.add_flag("--jsonl", a->jsonl,
               "print each reply as one line of JSON, {\"reply\",\"reasoning\",\"tokens\",\"stopped_by\"} "
               "(newlines in a reply stay inside its record)");
  sub.add_flag("--no-thinking", a->no_thinking, "reply without a think channel");
  sub.add_option("--think-effort", a->effort, "thinking effort: low, high or max")
      ->check(CLI::IsMember({"low", "high", "max"}))
      ->capture_default_str();
  sub.add_option("--max-reply", a->max_reply, fmt::format("most tokens per reply (1..{})", kMaxPositions))
      ->check(CLI::Range(1, int(kMaxPositions)))
      ->capture_default_str();
  sub.add_option(
         "--context", a->context,
         fmt::format("tokens the whole conversation may hold (16..{}; sizes the KV cache and the plan)",
                     kMaxPositions))
      ->check(CLI::Range(size_t{16}, kMaxPositions))
      ->capture_default_str();
  sub.add_option("--save-state", a->save_state, "write the state (K3ST) when the chat ends");
  sub.add_option("--tools", a->tools,
                 "JSON file of tool declarations (OpenAI's tools array); calls are printed, /tool RESULT "
                 "answers them");
  add_sampler_flags(sub, a->sampling);
  sub.add_flag("--recompute", a->dec.recompute,
               "recompute the whole conversation every token (slow; checks)");
  sub.add_option("--config", a->dec.config, "config.json to use (default MODEL_DIR/config.json)");
  sub.add_option(
         "--spec", a->spec,
         "speculative decoding: verify up to N prompt-lookup drafts per pass (0..16, greedy only; the "
         "same reply)")
      ->capture_default_str();
  sub.add_option("--spec-min-match", a->spec_min_match,
                 "with --spec: draft only after a match of at least M ids (1..16; default 2)");
  sub.add_option("--spec-policy", a->spec_policy,
                 "with --spec: adaptive (the default: fewer drafts and pauses while they are rejected) or "
                 "fixed (N drafts at every match)");
  sub.add_option("--threads", a->threads, "compute threads (0 = oneTBB default)")->check(CLI::Range(0, 4096));
  add_stream_flags(sub, a->dec.stream);
  return [a] { return run_chat(*a); };
}

}  // namespace k3::pipeline
