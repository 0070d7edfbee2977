// The Kimi tokenizer: a tiktoken-format rank vocabulary (`tiktoken.model`, one `base64(bytes) rank`
// per line) plus the special tokens of `tokenizer_config.json`, with the Kimi (or o200k)
// pre-tokenizer and rank BPE. Behaviour is tiktoken's, which is the reference; docs/tokenizer.md
// states every rule this file relies on.
//
// Text is UTF-8 bytes. Ids are int32. A Tokenizer is immutable after load and safe to share
// between threads.
#pragma once
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace k3::io::text {

enum class Pattern { kimi, o200k };

// "kimi" / "o200k"; anything else is a usage error naming `flag`.
Pattern parse_pattern(std::string_view name, std::string_view flag);

class Tokenizer {
 public:
  // DIR/tiktoken.model + DIR/tokenizer_config.json (added_tokens_decoder). Throws io::Error
  // (runtime) naming the file and line for a malformed file; usage when DIR has neither file.
  static Tokenizer load_dir(const std::filesystem::path& dir, Pattern = Pattern::kimi);
  // A bare rank file with no special tokens (the parity data, byte-level vocabularies).
  static Tokenizer load_vocab(const std::filesystem::path& tiktoken_file, Pattern = Pattern::kimi);

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  // allow_special: special-token texts in `text` become their ids (leftmost occurrence first, the
  // longest special at that position); otherwise they are ordinary text. Moonshot's wrapper allows
  // them, so chat control segments pass true and user content false. Includes Moonshot's chunking
  // (400,000 code points, runs of more than 25,000 space / non-space code points are cut).
  // Invalid UTF-8 is a usage error naming the byte offset.
  std::vector<int32_t> encode(std::string_view text, bool allow_special) const;
  std::vector<int32_t> encode_ordinary(std::string_view text) const { return encode(text, false); }

  // The pre-tokenizer alone: the pieces BPE sees, as byte ranges of `text` (ordinary text only).
  std::vector<std::string_view> pieces(std::string_view text) const;
  // The same with special texts (when allow_special) cut out as pieces of their own, as encode sees
  // them: each special piece is one id, each other piece is BPE-encoded on its own.
  std::vector<std::string_view> pieces(std::string_view text, bool allow_special) const;

  // Concatenated token bytes (specials as their text). An id outside the vocabulary is a usage
  // error naming it. The result need not be valid UTF-8 (a token may hold part of a code point).
  std::string decode(std::span<const int32_t> ids) const;
  std::string_view token_bytes(int32_t id) const;  // same rule for bad ids

  // One past the largest id (ordinary or special).
  int32_t n_ids() const;
  int32_t n_ranks() const;  // ordinary tokens
  bool is_special(int32_t id) const;
  std::optional<int32_t> special_id(std::string_view text) const;  // "<|end_of_msg|>" -> 163586
  Pattern pattern() const;
  // Where this tokenizer came from, for messages: the directory or the rank file as given.
  const std::string& source() const;

  // Every id must fit the model's embedding: refuses (runtime, naming the tokenizer source and
  // the first offending id) a tokenizer with ids >= model_vocab.
  void check_fits(int32_t model_vocab) const;

 private:
  struct Impl;
  explicit Tokenizer(std::unique_ptr<Impl>);
  std::unique_ptr<Impl> impl_;
};

// Streaming detokenizer: feed ids as they are generated, print what comes back. Never returns half
// a UTF-8 sequence: an incomplete trailing sequence is held until its last byte arrives. A byte
// that can never start or continue a valid sequence becomes U+FFFD (one per maximal invalid
// subsequence, as Python's errors="replace"). finish() flushes what is held (as U+FFFD).
class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tok) : tok_(&tok) {}
  std::string push(int32_t id);
  std::string push_bytes(std::string_view bytes);
  std::string finish();

 private:
  const Tokenizer* tok_;
  std::string held_;
};

}  // namespace k3::io::text
