// `k3flow tokenize` and `k3flow detokenize`: text <-> Kimi token ids from the command line.
//   tokenize   (MODEL_DIR | --tokenizer DIR | --vocab FILE [--pattern kimi|o200k]) [--file F | TEXT]
//              [--pieces] [--json] [--ordinary]
//   detokenize (same source) --ids 1,2,3
// Special-token texts become their ids unless --ordinary (Moonshot's wrapper allows them too).
#include <fmt/format.h>

#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "io/error.hpp"
#include "io/json_text.hpp"
#include "io/text/tokenizer.hpp"
#include "pipeline/cli/commands.hpp"
#include "pipeline/support/id_list.hpp"
#include "pipeline/support/output_file.hpp"

namespace k3::pipeline {

namespace {

namespace fs = std::filesystem;
using io::text::Tokenizer;

struct Source {
  std::string tokenizer_dir, vocab_file, pattern = "kimi";
};

void add_source_flags(CLI::App& sub, Source& s) {
  sub.add_option("--tokenizer", s.tokenizer_dir, "directory with tiktoken.model + tokenizer_config.json")
      ->type_name("DIR");
  sub.add_option("--vocab", s.vocab_file, "a bare tiktoken rank file (no special tokens)")->type_name("FILE");
  sub.add_option("--pattern", s.pattern, "pre-tokenizer pattern: kimi or o200k")
      ->type_name("NAME")
      ->capture_default_str();
}

// Exactly one of MODEL_DIR (model_dir, may be empty), --tokenizer and --vocab.
Tokenizer load_source(const std::string& command, const std::string& model_dir, const Source& s) {
  const auto pattern = io::text::parse_pattern(s.pattern, "--pattern");
  const int given = !model_dir.empty() + !s.tokenizer_dir.empty() + !s.vocab_file.empty();
  if (given != 1)
    throw io::usage_error(
        fmt::format("{}: give exactly one tokenizer source: MODEL_DIR, --tokenizer DIR or "
                    "--vocab FILE ({} given)",
                    command, given));
  if (!s.vocab_file.empty()) {
    check_input_file(s.vocab_file, "--vocab");
    return Tokenizer::load_vocab(s.vocab_file, pattern);
  }
  const std::string& dir = model_dir.empty() ? s.tokenizer_dir : model_dir;
  const std::string what = model_dir.empty() ? "--tokenizer" : "MODEL_DIR";
  check_input_dir(dir, what);
  if (!fs::is_regular_file(fs::path(dir) / "tiktoken.model"))
    throw io::usage_error(fmt::format("{} {}: has no tiktoken.model", what, dir));
  return Tokenizer::load_dir(dir, pattern);
}

std::string read_input(const std::string& file) {
  if (file != "-") check_input_file(file, "--file");
  FILE* f = file == "-" ? stdin : std::fopen(file.c_str(), "rb");
  if (!f) throw io::usage_error(fmt::format("--file: cannot open {}", file));
  std::string data;
  char buf[1 << 16];
  size_t n = 0;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) data.append(buf, n);
  const bool failed = std::ferror(f);
  if (f != stdin) std::fclose(f);
  if (failed) throw io::runtime_error(fmt::format("--file: cannot read {}", file));
  return data;
}

void append_ids(std::string& out, const std::vector<int32_t>& ids, const char* sep) {
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i) out += sep;
    out += std::to_string(ids[i]);
  }
}

struct TokenizeArgs {
  std::vector<std::string> positional;  // [MODEL_DIR] [TEXT]
  Source source;
  std::string file;
  bool pieces = false, json = false, ordinary = false;
};

// One output line for one input line (or the whole TEXT).
void tokenize_line(const Tokenizer& tok, const TokenizeArgs& a, std::string_view line, std::string& out) {
  const bool specials = !a.ordinary;
  std::vector<int32_t> ids;
  if (a.json || !a.pieces) ids = tok.encode(line, specials);
  std::string pieces;
  if (a.pieces) {
    pieces += '[';
    bool first = true;
    for (const std::string_view p : tok.pieces(line, specials)) {
      if (!first) pieces += ", ";
      first = false;
      pieces += io::json_quote(p);
    }
    pieces += ']';
  }
  if (a.json) {
    out += "{\"ids\": [";
    append_ids(out, ids, ", ");
    out += ']';
    if (a.pieces) out += ", \"pieces\": " + pieces;
    out += '}';
  } else if (a.pieces) {
    out += pieces;
  } else {
    append_ids(out, ids, " ");
  }
  out += '\n';
}

void write_stdout(const std::string& s) {
  if (std::fwrite(s.data(), 1, s.size(), stdout) != s.size() || std::fflush(stdout) != 0)
    throw io::runtime_error("stdout: write failed");
}

}  // namespace

Action add_tokenize(CLI::App& sub) {
  auto a = std::make_shared<TokenizeArgs>();
  sub.add_option("args", a->positional,
                 "MODEL_DIR (tiktoken.model + tokenizer_config.json) unless --tokenizer or --vocab is given, "
                 "then TEXT to encode unless --file is given")
      ->type_name("[MODEL_DIR] [TEXT]")
      ->expected(0, 2);
  add_source_flags(sub, a->source);
  sub.add_option("--file", a->file, "encode this file line by line (split on \\n only; - is stdin)")
      ->type_name("F");
  sub.add_flag("--pieces", a->pieces, "print each line's pre-tokenizer pieces as a JSON array of strings");
  sub.add_flag("--json", a->json, "print {\"ids\": [...]} per line");
  sub.add_flag("--ordinary", a->ordinary, "special-token texts are ordinary text");
  return [a] {
    const bool flag_source = !a->source.tokenizer_dir.empty() || !a->source.vocab_file.empty();
    std::vector<std::string> pos = a->positional;
    std::string model_dir;
    if (!flag_source && !pos.empty()) {
      model_dir = pos.front();
      pos.erase(pos.begin());
    }
    if (pos.size() > 1)
      throw io::usage_error(fmt::format("tokenize: unexpected argument \"{}\" (one TEXT at most)", pos[1]));
    const bool has_text = !pos.empty();
    if (has_text == !a->file.empty())
      throw io::usage_error("tokenize: give the text to encode as TEXT or as --file F (exactly one)");
    const Tokenizer tok = load_source("tokenize", model_dir, a->source);

    std::string out;
    if (has_text) {
      tokenize_line(tok, *a, pos.front(), out);
    } else {
      const std::string data = read_input(a->file);
      for (size_t start = 0; start < data.size();) {
        size_t end = data.find('\n', start);
        if (end == std::string::npos) end = data.size();
        tokenize_line(tok, *a, std::string_view(data).substr(start, end - start), out);
        start = end + 1;
      }
    }
    write_stdout(out);
    return 0;
  };
}

Action add_detokenize(CLI::App& sub) {
  struct Args {
    std::string model_dir, ids;
    Source source;
  };
  auto a = std::make_shared<Args>();
  sub.add_option("MODEL_DIR", a->model_dir, "model directory (tiktoken.model + tokenizer_config.json)")
      ->type_name("");
  add_source_flags(sub, a->source);
  sub.add_option("--ids", a->ids, "token ids separated by commas or spaces, e.g. 1,2,3")
      ->type_name("IDS")
      ->required();
  return [a] {
    const std::vector<int32_t> ids = parse_id_list(a->ids, "--ids");
    const Tokenizer tok = load_source("detokenize", a->model_dir, a->source);
    check_ids_in_vocab(ids, tok.n_ids(), "--ids");
    write_stdout(tok.decode(ids));
    return 0;
  };
}

}  // namespace k3::pipeline
