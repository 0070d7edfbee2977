#include "io/text/tokenizer.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "io/error.hpp"
#include "io/text/bpe.hpp"
#include "io/text/chunking.hpp"
#include "io/text/pretokenize.hpp"
#include "io/text/specials.hpp"
#include "io/text/unicode_classes.hpp"
#include "io/text/utf8.hpp"
#include "io/text/vocab.hpp"

namespace k3::io::text {

namespace fs = std::filesystem;

Pattern parse_pattern(std::string_view name, std::string_view flag) {
  if (name == "kimi") return Pattern::kimi;
  if (name == "o200k") return Pattern::o200k;
  throw io::usage_error(fmt::format("{}: unknown pattern \"{}\" (kimi or o200k)", flag, name));
}

struct Tokenizer::Impl {
  Vocab vocab;
  SpecialTokens specials;
  Pattern pattern;
  std::string source;

  void encode_ordinary(const DecodedText& t, size_t first, size_t last, std::vector<int32_t>& out) const {
    split_pieces(t, first, last, pattern, [&](size_t i, size_t e) {
      bpe_encode(vocab, t.bytes.substr(t.off[i], t.off[e] - t.off[i]), out);
    });
  }

  // Special texts are valid UTF-8, so a match starts and ends on code point boundaries.
  static size_t index_of_offset(const DecodedText& t, size_t byte) {
    return size_t(std::lower_bound(t.off.begin(), t.off.end(), uint32_t(byte)) - t.off.begin());
  }

  // Ordinary stretches and special tokens in order: ordinary(first, last) in code points of t,
  // special(match) for each special text found (leftmost, then longest).
  template <class Ordinary, class Special>
  void with_specials(const DecodedText& t, size_t first, size_t last, Ordinary ordinary,
                     Special special) const {
    const std::string_view piece = t.bytes.substr(0, t.off[last]);
    size_t from = t.off[first];
    while (const auto m = specials.find(piece, from)) {
      ordinary(index_of_offset(t, from), index_of_offset(t, m->pos));
      special(*m);
      from = m->pos + m->len;
    }
    ordinary(index_of_offset(t, from), last);
  }
};

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

Tokenizer Tokenizer::load_vocab(const fs::path& tiktoken_file, Pattern pattern) {
  std::error_code ec;
  if (!fs::is_regular_file(tiktoken_file, ec))
    throw io::usage_error(fmt::format("{}: no such rank file", tiktoken_file.string()));
  char_classes();  // build the Unicode table now rather than in the first encode
  auto impl = std::make_unique<Impl>(Impl{Vocab::load(tiktoken_file), {}, pattern, tiktoken_file.string()});
  return Tokenizer(std::move(impl));
}

Tokenizer Tokenizer::load_dir(const fs::path& dir, Pattern pattern) {
  const fs::path model = dir / "tiktoken.model", config = dir / "tokenizer_config.json";
  std::error_code ec;
  const bool has_model = fs::is_regular_file(model, ec), has_config = fs::is_regular_file(config, ec);
  if (!has_model && !has_config)
    throw io::usage_error(
        fmt::format("{}: not a tokenizer directory (it has neither tiktoken.model nor tokenizer_config.json)",
                    dir.string()));
  if (!has_model || !has_config)
    throw io::runtime_error(
        fmt::format("{}: missing (a tokenizer directory holds tiktoken.model and "
                    "tokenizer_config.json)",
                    (has_model ? config : model).string()));
  char_classes();
  Vocab vocab = Vocab::load(model);
  SpecialTokens specials = SpecialTokens::load_config(config, vocab.size());
  auto impl = std::make_unique<Impl>(Impl{std::move(vocab), std::move(specials), pattern, dir.string()});
  return Tokenizer(std::move(impl));
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool allow_special) const {
  std::vector<int32_t> out;
  out.reserve(text.size() / 4 + 4);
  const bool specials = allow_special && !impl_->specials.empty();
  for_each_cut(text, impl_->pattern, [&](const DecodedText& t, size_t first, size_t last) {
    if (!specials) return impl_->encode_ordinary(t, first, last, out);
    impl_->with_specials(
        t, first, last, [&](size_t a, size_t b) { impl_->encode_ordinary(t, a, b, out); },
        [&](const SpecialTokens::Match& m) { out.push_back(m.id); });
  });
  return out;
}

std::vector<std::string_view> Tokenizer::pieces(std::string_view text) const {
  return pieces(text, false);
}

std::vector<std::string_view> Tokenizer::pieces(std::string_view text, bool allow_special) const {
  std::vector<std::string_view> out;
  const bool specials = allow_special && !impl_->specials.empty();
  for_each_cut(text, impl_->pattern, [&](const DecodedText& t, size_t first, size_t last) {
    auto ordinary = [&](size_t a, size_t b) {
      split_pieces(t, a, b, impl_->pattern,
                   [&](size_t i, size_t e) { out.push_back(t.bytes.substr(t.off[i], t.off[e] - t.off[i])); });
    };
    if (!specials) return ordinary(first, last);
    impl_->with_specials(t, first, last, ordinary,
                         [&](const SpecialTokens::Match& m) { out.push_back(t.bytes.substr(m.pos, m.len)); });
  });
  return out;
}

std::string_view Tokenizer::token_bytes(int32_t id) const {
  if (id >= 0 && id < impl_->vocab.size()) return impl_->vocab.bytes(id);
  if (const std::string* s = impl_->specials.content(id)) return *s;
  throw io::usage_error(fmt::format(
      "token id {} is not in the vocabulary of {} (ranks 0..{}{})", id, impl_->source,
      impl_->vocab.size() - 1,
      impl_->specials.empty() ? std::string() : fmt::format(", {} special ids", impl_->specials.size())));
}

std::string Tokenizer::decode(std::span<const int32_t> ids) const {
  std::string out;
  out.reserve(ids.size() * 4);
  for (const int32_t id : ids) out.append(token_bytes(id));
  return out;
}

int32_t Tokenizer::n_ids() const {
  return std::max(impl_->vocab.size(), impl_->specials.max_id() + 1);
}
int32_t Tokenizer::n_ranks() const {
  return impl_->vocab.size();
}
bool Tokenizer::is_special(int32_t id) const {
  return impl_->specials.content(id) != nullptr;
}
std::optional<int32_t> Tokenizer::special_id(std::string_view text) const {
  return impl_->specials.id(text);
}
Pattern Tokenizer::pattern() const {
  return impl_->pattern;
}
const std::string& Tokenizer::source() const {
  return impl_->source;
}

void Tokenizer::check_fits(int32_t model_vocab) const {
  if (n_ids() <= model_vocab) return;
  // The smallest id that does not fit: an ordinary rank if the ranks already overflow, else a special.
  const int32_t first = impl_->vocab.size() > model_vocab ? std::max(model_vocab, 0)
                                                          : *impl_->specials.first_id_from(model_vocab);
  throw io::runtime_error(
      fmt::format("tokenizer {}: token id {} does not fit the model's vocabulary of {} ids", impl_->source,
                  first, model_vocab));
}

std::string StreamDecoder::push(int32_t id) {
  return push_bytes(tok_->token_bytes(id));
}

std::string StreamDecoder::push_bytes(std::string_view bytes) {
  held_.append(bytes);
  std::string out;
  const size_t used = append_replacing(out, held_, false);
  held_.erase(0, used);
  return out;
}

std::string StreamDecoder::finish() {
  std::string out;
  append_replacing(out, held_, true);
  held_.clear();
  return out;
}

}  // namespace k3::io::text
