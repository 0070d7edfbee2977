// k3flow: Kimi K3 on one CPU, weights streamed from NVMe. Exit codes (one place):
//   0 success, 1 runtime failure, 2 usage (bad flag / value / config), 4 run completed but invalid.
#include <cstdio>
#include <exception>
#include <map>
#include <new>

#include "io/error.hpp"
#include "pipeline/commands.hpp"

namespace {

int exit_code(k3::io::ErrorKind kind) {
  switch (kind) {
    case k3::io::ErrorKind::usage: return 2;
    case k3::io::ErrorKind::runtime: return 1;
    case k3::io::ErrorKind::run_invalid: return 4;
  }
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"k3flow: Kimi K3 streamed from NVMe through a oneTBB flow graph", "k3flow"};
  app.set_version_flag("--version", "k3flow 0.1.0");
  app.require_subcommand(1);

  std::map<CLI::App*, k3::pipeline::Action> actions;
  auto add = [&](const char* name, const char* help, auto adder) {
    CLI::App* sub = app.add_subcommand(name, help);
    actions[sub] = adder(*sub);
  };
  add("inspect", "summarise a checkpoint: config, layer map, tensor census, bytes", k3::pipeline::add_inspect);
  add("synth", "write a synthetic checkpoint in the released format", k3::pipeline::add_synth);
  add("generate", "continue a prompt (text or token ids): greedy or sampled, resident or streamed",
      k3::pipeline::add_generate);
  add("chat", "talk to the model in K3's chat format; the state carries over between turns", k3::pipeline::add_chat);
  add("plan", "split a memory budget into resident, trunk ring, pinned layers and expert slots", k3::pipeline::add_plan);
  add("pack-trunk", "copy every layer's dense weights into one aligned trunk.bin + trunk.json",
      k3::pipeline::add_pack_trunk);
  add("bench", "compare the overlap strategies on one checkpoint and budget: s/token, overlap efficiency", k3::pipeline::add_bench);
  add("tokenize", "text -> Kimi token ids (or pre-tokenizer pieces), per line with --file", k3::pipeline::add_tokenize);
  add("detokenize", "Kimi token ids -> text (raw bytes)", k3::pipeline::add_detokenize);

  try {
    app.parse(argc, argv);
  } catch (const CLI::Success& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    app.exit(e);
    return 2;
  }
  try {
    for (CLI::App* sub : app.get_subcommands()) return actions.at(sub)();
  } catch (const k3::io::Error& e) {
    std::fprintf(stderr, "k3flow: %s\n", e.what());
    return exit_code(e.kind());
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "k3flow: out of memory\n");
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "k3flow: %s\n", e.what());
    return 1;
  }
  return 2;
}
