// The tokenizer (io/text/tokenizer.*, with bpe, pretokenize, utf8, specials): a fixed tokenizer
// directory -- fixtures/tokenizer/o200k_base.tiktoken as tiktoken.model and a tokenizer_config.json
// with Kimi-style specials, some sharing prefixes -- loaded once with Tokenizer::load_dir, encodes
// and decodes the input. The first byte picks the pattern (bit 0: kimi / o200k) and whether special
// texts are allowed (bit 1); the rest is the text. Invalid UTF-8 must be a usage Error; valid text
// must round-trip through encode + decode, through pieces(), and through the streaming decoder.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "io/text/tokenizer.hpp"
#include "tests/fuzz/fuzz_common.hpp"

namespace fs = k3::fuzz::fs;
using k3::io::text::Pattern;
using k3::io::text::Tokenizer;

namespace {
constexpr std::string_view kSpecials = R"({"added_tokens_decoder": {
  "200000": {"content": "[BOS]"}, "200001": {"content": "[EOS]"},
  "200002": {"content": "<|im_end|>"}, "200003": {"content": "<|im_user|>"},
  "200004": {"content": "<|im_assistant|>"}, "200005": {"content": "<|im_middle|>"},
  "200006": {"content": "<|im_"}, "200007": {"content": "<|end_of_msg|>"},
  "200008": {"content": "\u00e9t\u00e9"}, "200009": {"content": "  "}}})";

const Tokenizer& tokenizer(Pattern p) {
  static const fs::path dir = [] {
    const fs::path d = k3::fuzz::scratch_dir() / "tokenizer";
    fs::create_directories(d);
    fs::create_symlink(fs::path(K3_FIXTURES) / "tokenizer/o200k_base.tiktoken", d / "tiktoken.model");
    k3::fuzz::write_file(d / "tokenizer_config.json", kSpecials);
    return d;
  }();
  static const Tokenizer kimi = Tokenizer::load_dir(dir, Pattern::kimi);
  static const Tokenizer o200k = Tokenizer::load_dir(dir, Pattern::o200k);
  return p == Pattern::kimi ? kimi : o200k;
}
}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  (void)tokenizer(Pattern::kimi);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const Tokenizer& tok = tokenizer(data[0] & 1 ? Pattern::o200k : Pattern::kimi);
  const bool allow_special = data[0] & 2;
  const std::string_view text(reinterpret_cast<const char*>(data + 1), size - 1);
  std::vector<int32_t> ids;
  try {
    ids = tok.encode(text, allow_special);
  } catch (const k3::io::Error& e) {
    K3_FUZZ_CHECK(e.kind() == k3::io::ErrorKind::usage, "encode refuses only invalid UTF-8, as usage");
    return 0;
  }
  for (const int32_t id : ids) {
    K3_FUZZ_CHECK(id >= 0 && id < tok.n_ids(), "ids inside the vocabulary");
    K3_FUZZ_CHECK(allow_special || !tok.is_special(id), "no special ids without allow_special");
  }
  K3_FUZZ_CHECK(tok.decode(ids) == text, "decode(encode(text)) == text");
  std::string joined;
  for (const std::string_view piece : tok.pieces(text, allow_special)) {
    K3_FUZZ_CHECK(!piece.empty(), "no empty piece");
    joined.append(piece);
  }
  K3_FUZZ_CHECK(joined == text, "pieces concatenate to the text");
  k3::io::text::StreamDecoder stream(tok);
  std::string streamed;
  for (const int32_t id : ids) streamed += stream.push(id);
  streamed += stream.finish();
  K3_FUZZ_CHECK(streamed == text, "the streaming decoder returns valid UTF-8 text unchanged");
  return 0;
}
