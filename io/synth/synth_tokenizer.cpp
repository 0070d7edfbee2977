#include <fmt/format.h>

#include <fstream>
#include <string>

#include "io/error.hpp"
#include "io/synth/synth.hpp"

namespace k3::io::synth {

namespace {

// K3's named specials by offset from the first special id (163584 in the released vocabulary).
constexpr struct {
  int offset;
  const char* text;
} kK3Specials[] = {
    {0, "[BOS]"},
    {1, "[EOS]"},
    {2, "<|end_of_msg|>"},
    {3, "<|open|>"},
    {4, "<|close|>"},
    {5, "<|sep|>"},
    {6, "[start_header_id]"},
    {7, "[end_header_id]"},
    {9, "[EOT]"},
    {18, "<|media_begin|>"},
    {19, "<|media_content|>"},
    {20, "<|media_end|>"},
    {21, "<|media_pad|>"},
    {65, "<osagent_mode>"},
    {254, "[UNK]"},
    {255, "[PAD]"},
};

std::string base64(unsigned char b) {
  static const char* k = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string s;
  s += k[b >> 2];
  s += k[(b & 3) << 4];
  s += "==";
  return s;
}

// The first `n` lines of a tiktoken rank file, each checked to carry rank = its line number.
std::string rank_lines(const std::filesystem::path& file, int n, int& got) {
  std::ifstream f(file);
  std::string out, line;
  got = 0;
  while (got < n && std::getline(f, line)) {
    const size_t sp = line.find(' ');
    if (sp == std::string::npos || line.substr(sp + 1) != std::to_string(got))
      throw io::runtime_error(
          fmt::format("{}:{}: not a tiktoken rank line for rank {}", file.string(), got + 1, got));
    out += line + "\n";
    ++got;
  }
  return out;
}

}  // namespace

bool synth_tokenizer(int vocab, const std::filesystem::path& ranks_file, SynthCheckpoint& plan,
                     std::string& description) {
  if (vocab < 256) {
    description = fmt::format("no tokenizer: a vocabulary of {} ids cannot hold the 256 bytes", vocab);
    return false;
  }
  const bool k3_block = vocab >= 512;
  const int first_special = k3_block ? vocab - 256 : 256;
  int n_ranks = 0;
  std::string ranks;
  std::error_code ec;
  if (first_special > 256 && !ranks_file.empty() && std::filesystem::exists(ranks_file, ec))
    ranks = rank_lines(ranks_file, first_special, n_ranks);
  if (n_ranks < 256) {
    ranks.clear();
    for (int b = 0; b < 256; ++b) ranks += fmt::format("{} {}\n", base64(static_cast<unsigned char>(b)), b);
    n_ranks = 256;
  }

  std::string added;
  auto add = [&](int id, const std::string& text) {
    added += fmt::format(
        "{}    \"{}\": {{\"content\": \"{}\", \"lstrip\": false, \"normalized\": false, "
        "\"rstrip\": false, \"single_word\": false, \"special\": true}}",
        added.empty() ? "" : ",\n", id, text);
  };
  for (int id = n_ranks; id < vocab; ++id) {
    std::string text = fmt::format("<|reserved_token_{}|>", id);
    if (k3_block && id >= first_special)
      for (const auto& s : kK3Specials)
        if (id - first_special == s.offset) text = s.text;
    add(id, text);
  }
  plan.tiktoken_model = std::move(ranks);
  plan.tokenizer_config =
      fmt::format("{{\n  \"added_tokens_decoder\": {{\n{}\n  }}{}\n}}\n", added,
                  k3_block ? ",\n  \"bos_token\": \"[BOS]\",\n  \"eos_token\": \"[EOS]\"" : "");
  description = fmt::format(
      "tokenizer: {} ranks ({}), {} specials{}", n_ranks,
      n_ranks > 256 ? ranks_file.filename().string() + ", its first ranks" : "byte-level", vocab - n_ranks,
      k3_block ? fmt::format(" (K3's block at {}..{})", first_special, vocab - 1) : "");
  return true;
}

}  // namespace k3::io::synth
