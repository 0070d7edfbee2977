// tiktoken.model (io/text/vocab.*): the bytes become a rank file that Vocab::load reads. An accepted
// vocabulary must map every token's bytes back to its rank, and a tokenizer over it
// (Tokenizer::load_vocab: rank BPE on the fuzzed merges) must round-trip a fixed text.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "io/text/tokenizer.hpp"
#include "io/text/vocab.hpp"
#include "tests/fuzz/fuzz_common.hpp"

namespace fs = k3::fuzz::fs;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const fs::path path = k3::fuzz::scratch_dir() / "tiktoken.model";
  k3::fuzz::write_file(path, data, size);
  bool loaded = false;
  k3::fuzz::accepts([&] {
    const k3::io::text::Vocab v = k3::io::text::Vocab::load(path);
    K3_FUZZ_CHECK(v.size() >= 256, "every byte is a token");
    for (int32_t r = 0; r < v.size(); ++r) K3_FUZZ_CHECK(v.find(v.bytes(r)) == r, "find(bytes(r)) == r");
    for (int b = 0; b < 256; ++b) {
      const char c = char(b);
      K3_FUZZ_CHECK(v.byte_rank(uint8_t(b)) == v.find(&c, 1), "byte_rank");
    }
    loaded = true;
  });
  if (!loaded) return 0;
  static const std::string text =
      "Hello, world! It's 2026: the pipeline reads every layer ahead.\n\n  \xe4\xbd\xa0\xe5\xa5\xbd 123456 "
      "caf\xc3\xa9 \xf0\x9f\x98\x80 don't";
  k3::fuzz::accepts([&] {
    const auto tok = k3::io::text::Tokenizer::load_vocab(path);
    const std::vector<int32_t> ids = tok.encode_ordinary(text);
    K3_FUZZ_CHECK(tok.decode(ids) == text, "decode(encode(text)) == text");
  });
  return 0;
}
