#include "pipeline/run/run_context.hpp"

#include <fmt/format.h>

#include <filesystem>

#include "io/error.hpp"
#include "pipeline/run/model_tokenizer.hpp"
#include "pipeline/support/output_file.hpp"

namespace k3::pipeline {

void check_path(const PathCheck& c) {
  switch (c.kind) {
    case PathCheck::Kind::input_file:
      check_input_file(c.path, c.flag);
      break;
    case PathCheck::Kind::input_dir:
      check_input_dir(c.path, c.flag);
      break;
    case PathCheck::Kind::writable:
      check_writable(c.path, c.flag);
      break;
  }
}

namespace {

void check_run_paths(const RunSpec& s) {
  const DecoderOptions& dec = s.dec;
  check_stream_flags(dec.stream);
  check_model_dir(dec.model_dir, dec.config.has_value());
  if (dec.config) check_input_file(*dec.config, "--config");
  if (s.tokenizer) check_input_dir(*s.tokenizer, "--tokenizer");
  for (const PathCheck& c : s.before_trunk) check_path(c);
  if (!dec.stream.trunk_dir.empty()) check_trunk_dir(dec.stream.trunk_dir);
  for (const PathCheck& c : s.after_trunk) check_path(c);
}

}  // namespace

RunContext::RunContext(const RunSpec& s) : model_dir_(s.dec.model_dir), tokenizer_dir_(s.tokenizer) {
  check_run_paths(s);
  if (s.checks) s.checks();
  limit_.emplace(s.threads);
  s.dec.stream.threads = limit_->threads();
  cfg = load_model_config(s.dec.model_dir, s.dec.config);
  if (s.dec.layers > cfg.n_layers)
    throw io::usage_error(fmt::format("--layers {}: the model has {} layers", s.dec.layers, cfg.n_layers));
}

RunContext::RunContext(const ChildRunSpec& s) : model_dir_(s.model_dir), threads_(s.threads) {
  const std::filesystem::path dir(s.model_dir);
  if (!std::filesystem::exists(dir / "config.json"))
    throw io::usage_error(fmt::format("MODEL_DIR: no config.json in {}", s.model_dir));
  cfg = io::load_config(dir / "config.json");
}

void RunContext::load_tokenizer(const char* needed_by) {
  tok = model_tokenizer(model_dir_, tokenizer_dir_, cfg, needed_by);
}

}  // namespace k3::pipeline
