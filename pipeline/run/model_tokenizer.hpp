// Which tokenizer a command uses for a model: `--tokenizer DIR` when given, else the model
// directory itself when it holds `tiktoken.model` (the released checkpoint ships it beside the
// shards; `synth` writes one; fixtures/tiny-k3 has a byte-level one). Every id it can produce must
// fit the model's embedding.
#pragma once
#include <optional>
#include <string>

#include "io/config.hpp"
#include "io/text/tokenizer.hpp"

namespace k3::pipeline {

// nullopt when there is none and `needed_by` is null; with `needed_by` (e.g. "--prompt") a missing
// tokenizer is a usage error (exit 2) that names that flag and says where it looked; so is a
// --tokenizer DIR that does not exist or has no tiktoken.model.
std::optional<io::text::Tokenizer> model_tokenizer(const std::string& model_dir,
                                                   const std::optional<std::string>& tokenizer_dir,
                                                   const io::ModelConfig&, const char* needed_by);

}  // namespace k3::pipeline
