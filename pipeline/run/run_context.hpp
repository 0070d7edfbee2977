// What generate, chat, serve and bench set up alike before they read a weight: one RunContext,
// built by one call after the command's own usage checks. For a command that computes in this
// process (generate, chat, serve), in this order:
//   1. paths: the stream flags (check_stream_flags), then MODEL_DIR, --config, --tokenizer, the
//      command's own inputs, --trunk, the command's own outputs -- every path is checked before the
//      first read, so a typo cannot throw a long run away;
//   2. the command's checks that come after its paths and before the model (RunSpec::checks);
//   3. threads: the --threads cap (ThreadLimit), held while the context lives; its value is passed
//      down in the run's StreamFlags::threads (the streamed graph's arena) and by threads();
//   4. model: the config read (MODEL_DIR/config.json or --config) and --layers checked against it.
// The tokenizer is loaded by load_tokenizer(), where each command needs it (generate after it has
// printed the config, chat on every rank with the weights, serve on rank 0 with the config).
// bench's runs are child processes (each a `k3flow generate` that sets itself up so): its context
// holds the config and the --threads value it passes to them, and no cap of its own.
// What differs between the commands -- their usage checks, stdout's split from the diagnostics,
// the ranks' expert slices -- stays in the commands.
#pragma once
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "io/config.hpp"
#include "io/text/tokenizer.hpp"
#include "pipeline/run/decoder.hpp"
#include "pipeline/run/thread_limit.hpp"

namespace k3::pipeline {

// One of a command's own paths, checked in its place among the shared ones (usage error, exit 2,
// naming `flag`): input_file / input_dir must exist as one, writable must be creatable
// (pipeline/support/output_file.hpp).
struct PathCheck {
  enum class Kind { input_file, input_dir, writable };
  Kind kind;
  const char* flag;
  std::string path;
};
void check_path(const PathCheck&);

// A command that computes in this process (generate, chat, serve).
struct RunSpec {
  DecoderOptions& dec;  // MODEL_DIR, --config, --layers, the stream flags; gets the threads
  const std::optional<std::string>& tokenizer;  // --tokenizer DIR
  int threads = 0;                              // --threads (0: oneTBB's default)
  std::vector<PathCheck> before_trunk{};        // the command's inputs: after --tokenizer, before --trunk
  std::vector<PathCheck> after_trunk{};         // its outputs (and any later input): after --trunk
  std::function<void()> checks{};               // after the paths, before the threads and the model
};

// A command whose runs are child processes (bench).
struct ChildRunSpec {
  std::string model_dir;
  int threads = 0;  // --threads, passed to every run as given (0: the child's default)
};

class RunContext {
 public:
  explicit RunContext(const RunSpec&);
  // bench: MODEL_DIR must hold a config.json (usage error naming MODEL_DIR otherwise), read as is;
  // its children check the rest.
  explicit RunContext(const ChildRunSpec&);
  RunContext(const RunContext&) = delete;
  RunContext& operator=(const RunContext&) = delete;

  // The threads the run uses: with a cap, its threads() (the --threads value, or oneTBB's default
  // for 0); for bench's children, --threads as given.
  int threads() const { return limit_ ? limit_->threads() : threads_; }

  // model_tokenizer() for this model and --tokenizer: nullopt when there is none and `needed_by` is
  // null, else a usage error naming `needed_by` (pipeline/run/model_tokenizer.hpp).
  void load_tokenizer(const char* needed_by);

  io::ModelConfig cfg;
  std::optional<io::text::Tokenizer> tok;  // after load_tokenizer()

 private:
  std::string model_dir_;
  std::optional<std::string> tokenizer_dir_;
  int threads_ = 0;
  std::optional<ThreadLimit> limit_;
};

}  // namespace k3::pipeline
