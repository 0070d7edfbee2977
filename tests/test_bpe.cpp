// io/text/bpe.*: the scan form (tiktoken's) and the heap form give the same ids on every kind of
// piece, and a 25,000-byte piece (the longest Moonshot's chunking lets through) is not quadratic.
#include <doctest/doctest.h>

#include <chrono>
#include <random>
#include <string>
#include <vector>

#include "io/text/bpe.hpp"
#include "tests/run_helpers.hpp"
#include "tests/tokenizer_cases.hpp"

using namespace k3::io::text;

namespace {

const Vocab& o200k() {
  static const Vocab v = Vocab::load(k3::test::tokenizer_fixture("o200k_base.tiktoken"));
  return v;
}

std::vector<int32_t> scan(std::string_view s) {
  std::vector<int32_t> out;
  bpe_merge_scan(o200k(), s, out);
  return out;
}
std::vector<int32_t> heap(std::string_view s) {
  std::vector<int32_t> out;
  bpe_merge_heap(o200k(), s, out);
  return out;
}

std::string concat(const std::vector<int32_t>& ids) {
  std::string s;
  for (const int32_t id : ids) s += o200k().bytes(id);
  return s;
}

}  // namespace

TEST_CASE("scan and heap forms agree on random pieces of corpus text, letters, repeats and bytes") {
  const std::string corpus = k3::test::slurp(k3::test::tokenizer_fixture("kimi_pattern_cases.json"));
  std::mt19937 rng(12345);
  size_t checked = 0;
  for (int round = 0; round < 3000; ++round) {
    const size_t len = 2 + rng() % 300;
    std::string s;
    switch (round % 4) {
      case 0:
        s = corpus.substr(rng() % (corpus.size() - len), len);
        break;
      case 1:
        for (size_t i = 0; i < len; ++i) s += char('a' + rng() % 26);
        break;
      case 2:
        for (size_t i = 0; i < len; ++i) s += "ab"[rng() % 2 ? 0 : (i % 3 == 0)];
        break;
      case 3:
        for (size_t i = 0; i < len; ++i) s += char(rng() % 256);
        break;
    }
    CAPTURE(s);
    const auto a = scan(s), b = heap(s);
    CHECK(a == b);
    CHECK(concat(a) == s);
    ++checked;
  }
  CHECK(checked == 3000);
}

TEST_CASE("a piece that is itself a token is one id; bpe_encode picks either form with the same result") {
  // Many tokens would not come back from merging their own bytes; emitting them directly matters.
  size_t not_by_merges = 0;
  for (int32_t r = 256; r < o200k().size(); r += 97) {
    const std::string_view s = o200k().bytes(r);
    std::vector<int32_t> out;
    bpe_encode(o200k(), s, out);
    CHECK(out == std::vector<int32_t>{r});
    not_by_merges += s.size() > 1 && scan(s) != std::vector<int32_t>{r};
  }
  MESSAGE(not_by_merges << " sampled tokens are not what merging their bytes gives");
  std::string long_piece;
  for (int i = 0; i < 60; ++i) long_piece += "abcXYZ"[i % 6] + std::string("q");
  std::vector<int32_t> out;
  bpe_encode(o200k(), long_piece, out);
  CHECK(out == scan(long_piece));
}

TEST_CASE("25,000-byte pieces: heap equals scan on 3,000 bytes, and 25,000 take well under a second") {
  std::mt19937 rng(7);
  std::string letters, same(25000, 'a');
  for (int i = 0; i < 25000; ++i) letters += char('a' + rng() % 26);
  CHECK(heap(letters.substr(0, 3000)) == scan(letters.substr(0, 3000)));
  CHECK(heap(same.substr(0, 3000)) == scan(same.substr(0, 3000)));
  for (const std::string* s : {&letters, &same}) {
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<int32_t> out;
    bpe_encode(o200k(), *s, out);
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    CHECK(concat(out) == *s);
    CHECK(secs < 1.0);
  }
}
