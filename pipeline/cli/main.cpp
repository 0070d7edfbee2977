// k3flow: Kimi K3 on one CPU, weights streamed from NVMe. Every refusal is one line on stderr
// starting "k3flow: "; the exit code comes from pipeline/support/exit_codes.hpp (0 success, 1 runtime,
// 2 usage, 4 invalid run, 130/143 interrupted).
#include <fmt/format.h>

#include <cstdio>
#include <exception>
#include <map>
#include <new>
#include <string>

#include "io/error.hpp"
#include "pipeline/cli/commands.hpp"
#include "pipeline/ranks/comm.hpp"
#include "pipeline/ranks/session.hpp"
#include "pipeline/support/exit_codes.hpp"

namespace {

// A refusal is one line: a message that spans lines (CLI11's, or a nested cause) is joined.
int refuse(std::string message, int code) {
  while (!message.empty() && (message.back() == '\n' || message.back() == ' ')) message.pop_back();
  for (size_t at = message.find('\n'); at != std::string::npos; at = message.find('\n', at))
    message.replace(at, 1, "; ");
  std::fflush(stdout);  // what the command printed comes before the refusal, not after it at exit
  std::fprintf(stderr, "k3flow: %s\n", message.c_str());
  return code;
}

}  // namespace

int main(int argc, char** argv) {
  namespace pl = k3::pipeline;
  // Under mpirun: MPI's world, rank 0 owns the console (docs/distributed.md); otherwise nothing.
  pl::ranks::Session session(argc, argv);
  if (!session.refusal().empty()) return refuse(session.refusal(), pl::kExitUsage);
  // Every rank parses the same command line, so a parse error is the same on all (printed once);
  // an error one rank raised alone ends every rank's run (Session::after_error).
  auto fail = [&session](const std::string& message, int code, bool collective) {
    if (session.prints_error(collective)) refuse(session.error_prefix(collective) + message, code);
    session.after_error(code, collective);
    return code;
  };
  CLI::App app{"k3flow: Kimi K3 streamed from NVMe through a oneTBB flow graph", "k3flow"};
  app.set_version_flag("--version", "k3flow 0.1.0");
  app.require_subcommand(1);
  app.footer(
      "Exit codes: 0 success, 1 runtime failure (a file, tensor or read that is wrong), 2 usage (a bad "
      "flag, value or path), 4 run completed but invalid (non-finite logits), 130 Ctrl-C, 143 SIGTERM.");

  std::map<CLI::App*, k3::pipeline::Action> actions;
  auto add = [&](const char* name, const char* help, auto adder) {
    CLI::App* sub = app.add_subcommand(name, help);
    actions[sub] = adder(*sub);
  };
  add("inspect", "summarise a checkpoint: config, layer map, tensor census, bytes",
      k3::pipeline::add_inspect);
  add("synth", "write a synthetic checkpoint in the released format", k3::pipeline::add_synth);
  add("generate", "continue a prompt (text or token ids): greedy or sampled, resident or streamed",
      k3::pipeline::add_generate);
  add("chat", "talk to the model in K3's chat format; the state carries over between turns",
      k3::pipeline::add_chat);
  add("plan", "split a memory budget into resident, trunk ring, pinned layers and expert slots",
      k3::pipeline::add_plan);
  add("cache-sim", "replay an expert routing trace through the expert cache: hit rate per policy vs Belady",
      k3::pipeline::add_cache_sim);
  add("pack-trunk", "copy every layer's dense weights into one aligned trunk.bin + trunk.json",
      k3::pipeline::add_pack_trunk);
  add("bench", "compare the overlap strategies on one checkpoint and budget: s/token, overlap efficiency",
      k3::pipeline::add_bench);
  add("probe",
      "measure the device's read ceiling (deep queue, large requests) beside the engine's reader settings",
      k3::pipeline::add_probe);
  add("tokenize", "text -> Kimi token ids (or pre-tokenizer pieces), per line with --file",
      k3::pipeline::add_tokenize);
  add("detokenize", "Kimi token ids -> text (raw bytes)", k3::pipeline::add_detokenize);
  add("serve", "an OpenAI-compatible HTTP server: continuous batching over the engine",
      k3::pipeline::add_serve);

  try {
    app.parse(argc, argv);
  } catch (const CLI::Success& e) {
    return app.exit(e);  // --help, --version
  } catch (const CLI::ParseError& e) {
    // No subcommand chosen: CLI11 says only that one is required; name the word it did not know.
    if (app.get_subcommands().empty() && dynamic_cast<const CLI::RequiredError*>(&e) != nullptr) {
      std::string known;
      for (const CLI::App* sub : app.get_subcommands({}))
        known += (known.empty() ? "" : ", ") + sub->get_name();
      for (int i = 1; i < argc; ++i)
        if (argv[i][0] != '-')
          return fail(fmt::format("unknown subcommand '{}' (one of: {})", argv[i], known), pl::kExitUsage,
                      true);
      return fail(
          fmt::format("a subcommand is required: one of {} (k3flow --help says what each does)", known),
          pl::kExitUsage, true);
    }
    // CLI11's own message, as one line, naming the command whose --help lists the flags.
    std::string where = "k3flow";
    for (CLI::App* sub : app.get_subcommands()) where += " " + sub->get_name();
    return fail(std::string(e.what()) + " (" + where + " --help lists the flags)", pl::kExitUsage, true);
  }
  for (CLI::App* sub : app.get_subcommands())
    if (session.size() > 1 && sub->get_name() != "generate" && sub->get_name() != "chat" &&
        sub->get_name() != "serve")
      return fail(fmt::format("only `generate`, `chat` and `serve` run over several ranks "
                              "(docs/distributed.md §6): run `k3flow {}` without mpirun",
                              sub->get_name()),
                  pl::kExitUsage, true);
  try {
    for (CLI::App* sub : app.get_subcommands()) return actions.at(sub)();
  } catch (const k3::io::Error& e) {
    return fail(e.what(), pl::exit_code(e.kind()),
                dynamic_cast<const pl::ranks::CollectiveError*>(&e) != nullptr);
  } catch (const std::bad_alloc&) {
    return fail("out of memory", pl::kExitRuntime, false);
  } catch (const std::exception& e) {
    return fail(e.what(), pl::kExitRuntime, false);
  }
  return pl::kExitUsage;
}
