#include "io/text/specials.hpp"

#include <fmt/format.h>
#include <simdjson.h>

#include <algorithm>

#include "io/error.hpp"

namespace k3::io::text {

SpecialTokens SpecialTokens::load_config(const std::filesystem::path& path, int32_t n_ranks) {
  const std::string where = path.string();
  auto fail = [&](const std::string& why) { return io::runtime_error(where + ": " + why); };

  simdjson::padded_string json;
  if (simdjson::padded_string::load(where).get(json) != simdjson::SUCCESS) throw fail("cannot be read");
  simdjson::dom::parser parser;
  simdjson::dom::element root;
  if (const auto err = parser.parse(json).get(root); err != simdjson::SUCCESS)
    throw fail(fmt::format("not valid JSON ({})", simdjson::error_message(err)));
  simdjson::dom::element decoder;
  if (root.at_key("added_tokens_decoder").get(decoder) != simdjson::SUCCESS)
    throw fail("no `added_tokens_decoder` (the special tokens, keyed by id)");
  simdjson::dom::object entries;
  if (decoder.get(entries) != simdjson::SUCCESS) throw fail("`added_tokens_decoder` is not an object");

  SpecialTokens t;
  for (const auto field : entries) {
    const std::string_view key = field.key;
    const bool decimal = !key.empty() && key.size() <= 10 &&
                         key.find_first_not_of("0123456789") == std::string_view::npos &&
                         (key.size() == 1 || key[0] != '0');
    const uint64_t id = decimal ? std::stoull(std::string(key)) : 0;
    if (!decimal || id > uint64_t(INT32_MAX))
      throw fail(fmt::format("added_tokens_decoder key \"{}\" is not a decimal token id below 2^31", key));
    std::string_view content;
    if (field.value.at_key("content").get(content) != simdjson::SUCCESS)
      throw fail(fmt::format("added_tokens_decoder[\"{}\"] has no string \"content\"", key));
    if (content.empty())
      throw fail(fmt::format("added_tokens_decoder[\"{}\"] has an empty \"content\"", key));
    if (int64_t(id) < n_ranks)
      throw fail(
          fmt::format("special token {} \"{}\" collides with an ordinary rank (the rank file has 0..{})", id,
                      content, n_ranks - 1));
    if (t.by_id_.count(int32_t(id))) throw fail(fmt::format("special token id {} repeats", id));
    if (const auto it = t.by_text_.find(content); it != t.by_text_.end())
      throw fail(
          fmt::format("special tokens {} and {} have the same content \"{}\"", it->second, id, content));
    t.by_id_.emplace(int32_t(id), std::string(content));
    t.by_text_.emplace(std::string(content), int32_t(id));
  }
  for (const auto& [text, id] : t.by_text_) {
    t.first_byte_[uint8_t(text[0])] = true;
    if (std::find(t.lengths_.begin(), t.lengths_.end(), text.size()) == t.lengths_.end())
      t.lengths_.push_back(text.size());
  }
  std::sort(t.lengths_.rbegin(), t.lengths_.rend());
  return t;
}

std::optional<int32_t> SpecialTokens::id(std::string_view text) const {
  const auto it = by_text_.find(text);
  if (it == by_text_.end()) return std::nullopt;
  return it->second;
}

const std::string* SpecialTokens::content(int32_t id) const {
  const auto it = by_id_.find(id);
  return it == by_id_.end() ? nullptr : &it->second;
}

std::optional<SpecialTokens::Match> SpecialTokens::find(std::string_view text, size_t from) const {
  if (by_text_.empty()) return std::nullopt;
  for (size_t pos = from; pos < text.size(); ++pos) {
    if (!first_byte_[uint8_t(text[pos])]) continue;
    for (const size_t len : lengths_) {  // longest first
      if (len > text.size() - pos) continue;
      const auto it = by_text_.find(text.substr(pos, len));
      if (it != by_text_.end()) return Match{pos, len, it->second};
    }
  }
  return std::nullopt;
}

}  // namespace k3::io::text
