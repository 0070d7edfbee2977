// io/text/text_stream.*: generated ids -> printable text, with end-of-turn ids and stop strings,
// on the real o200k ranks (fixtures/tokenizer) and the tiny model's byte vocabulary.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "io/text/text_stream.hpp"
#include "io/text/tokenizer.hpp"

using k3::io::text::end_of_turn_ids;
using k3::io::text::Pattern;
using k3::io::text::TextStream;
using k3::io::text::Tokenizer;

namespace {

const Tokenizer& o200k() {
  static const Tokenizer t =
      Tokenizer::load_vocab(std::string(K3_FIXTURES) + "/tokenizer/o200k_base.tiktoken", Pattern::o200k);
  return t;
}

struct Played {
  std::string printed;
  size_t consumed = 0;  // ids pushed up to and including the one that stopped
  bool stopped = false;
};

Played play(TextStream& s, const std::vector<int32_t>& ids) {
  Played p;
  for (int32_t id : ids) {
    ++p.consumed;
    const TextStream::Out o = s.push(id);
    p.printed += o.text;
    if (o.stop) {
      p.stopped = true;
      return p;
    }
  }
  p.printed += s.finish();
  return p;
}

}  // namespace

TEST_CASE("without stops the printed text is the decoded text, whatever the chunking") {
  const std::string text = "Grüße, 世界! A line\nand 🙂 emoji, ascii tail.";
  const std::vector<int32_t> ids = o200k().encode_ordinary(text);
  TextStream s(o200k(), {}, {});
  const Played p = play(s, ids);
  CHECK(p.printed == text);
  CHECK_FALSE(p.stopped);
}

TEST_CASE("a stop string ends the text just before it, even across token boundaries") {
  const std::string text = "The answer is 42. User: next question";
  const std::vector<int32_t> ids = o200k().encode_ordinary(text);
  for (const std::string stop : {"User:", "r: ne", ". U", "42"}) {
    CAPTURE(stop);
    TextStream s(o200k(), {}, {"never", stop});
    const Played p = play(s, ids);
    CHECK(p.stopped);
    CHECK(p.printed == text.substr(0, text.find(stop)));
    CHECK(p.consumed < ids.size());
  }
}

TEST_CASE("text that could grow into a stop string is held back, then released when it cannot") {
  const std::vector<int32_t> ids = o200k().encode_ordinary("abc Us then Uz");
  TextStream s(o200k(), {}, {"User"});
  std::string seen;
  for (int32_t id : ids) {
    const TextStream::Out o = s.push(id);
    CHECK_FALSE(o.stop);
    seen += o.text;
    // Never printed: a tail that is a proper prefix of "User".
    for (size_t n = 1; n < 4 && n <= seen.size(); ++n)
      CHECK(seen.compare(seen.size() - n, n, "User", 0, n) != 0);
  }
  CHECK(seen + s.finish() == "abc Us then Uz");
}

TEST_CASE("an end-of-turn id stops without printing itself; a multi-byte character is never split") {
  // 256-byte vocabulary: ids are bytes, so a code point arrives over several ids.
  const Tokenizer bytes = Tokenizer::load_dir(std::string(K3_FIXTURES) + "/tiny-k3");
  CHECK(end_of_turn_ids(bytes).empty());    // no specials in a byte vocabulary
  const std::string euro = "\xE2\x82\xAC";  // U+20AC
  TextStream s(bytes, {7}, {});
  CHECK(s.push(0xE2).text.empty());
  CHECK(s.push(0x82).text.empty());
  CHECK(s.push(0xAC).text == euro);
  const TextStream::Out end = s.push(7);
  CHECK(end.stop);
  CHECK(end.text.empty());
  CHECK(s.push(65).text.empty());  // nothing after the stop
}

TEST_CASE("an incomplete character at the cap is flushed as U+FFFD") {
  const Tokenizer bytes = Tokenizer::load_dir(std::string(K3_FIXTURES) + "/tiny-k3");
  TextStream s(bytes, {}, {});
  CHECK(s.push('a').text == "a");
  CHECK(s.push(0xE2).text.empty());
  CHECK(s.finish() == "\xEF\xBF\xBD");
}
