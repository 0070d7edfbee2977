#include "pipeline/run/model_tokenizer.hpp"

#include <fmt/format.h>

#include <filesystem>

#include "io/error.hpp"

namespace k3::pipeline {

std::optional<io::text::Tokenizer> model_tokenizer(const std::string& model_dir,
                                                   const std::optional<std::string>& tokenizer_dir,
                                                   const io::ModelConfig& cfg, const char* needed_by) {
  namespace fs = std::filesystem;
  const fs::path dir = tokenizer_dir ? fs::path(*tokenizer_dir) : fs::path(model_dir);
  std::error_code ec;
  if (tokenizer_dir && !fs::is_directory(dir, ec))
    throw io::usage_error(fmt::format("--tokenizer {}: {}", dir.string(),
                                      fs::exists(dir, ec) ? "is not a directory" : "does not exist"));
  if (tokenizer_dir && !fs::exists(dir / "tiktoken.model", ec))
    throw io::usage_error(fmt::format("--tokenizer {}: has no tiktoken.model", dir.string()));
  if (!tokenizer_dir && !fs::exists(dir / "tiktoken.model", ec)) {
    if (!needed_by) return std::nullopt;
    throw io::usage_error(fmt::format("{} needs a tokenizer: {} has no tiktoken.model (pass --tokenizer DIR)",
                                      needed_by, dir.string()));
  }
  io::text::Tokenizer tok = io::text::Tokenizer::load_dir(dir);
  tok.check_fits(cfg.vocab);
  return tok;
}

}  // namespace k3::pipeline
