// tokenizer_config.json (io/text/specials.*): the bytes become the file SpecialTokens::load_config
// reads (added_tokens_decoder above a 256-rank vocabulary). Every accepted special must be found by
// its id, its text, and a search of its text.
#include <cstddef>
#include <cstdint>
#include <string>

#include "io/text/specials.hpp"
#include "tests/fuzz/fuzz_common.hpp"

namespace fs = k3::fuzz::fs;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const fs::path path = k3::fuzz::scratch_dir() / "tokenizer_config.json";
  k3::fuzz::write_file(path, data, size);
  k3::fuzz::accepts([&] {
    const auto sp = k3::io::text::SpecialTokens::load_config(path, 256);
    size_t seen = 0;
    std::string all;
    for (auto id = sp.first_id_from(0); id;
         id = *id == INT32_MAX ? std::nullopt : sp.first_id_from(*id + 1)) {
      ++seen;
      K3_FUZZ_CHECK(*id >= 256, "above the ordinary ranks");
      const std::string* text = sp.content(*id);
      K3_FUZZ_CHECK(text && !text->empty(), "content(id)");
      K3_FUZZ_CHECK(sp.id(*text) == *id, "id(content(id)) == id");
      const auto m = sp.find(*text, 0);
      K3_FUZZ_CHECK(m && m->pos == 0 && m->len == text->size() && m->id == *id, "find(content) is itself");
      all += "x" + *text;
    }
    K3_FUZZ_CHECK(seen == sp.size(), "every id is listed");
    K3_FUZZ_CHECK(sp.empty() || sp.max_id() >= 256, "max_id");
    // The search tokenize and encode run over text holding every special (the fuzzer's hang
    // detection catches a search that does not advance).
    size_t found = 0;
    for (size_t from = 0; const auto m = sp.find(all, from); from = m->pos + m->len) ++found;
    K3_FUZZ_CHECK(found <= all.size(), "at most one match per byte");
  });
  return 0;
}
