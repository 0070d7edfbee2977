// Special tokens: the `added_tokens_decoder` of tokenizer_config.json (ids above the ordinary ranks,
// each with its literal text) and the search for them in text.
#pragma once
#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace k3::io::text {

class SpecialTokens {
 public:
  SpecialTokens() = default;

  // Reads `added_tokens_decoder` (an object; `{}` is allowed: no specials). Throws io::Error
  // (runtime, naming the file and the key) when it is missing or not an object, a key is not a
  // decimal id below 2^31, an entry has no string "content" or an empty one, two entries share a
  // content, or an id is below n_ranks (it would shadow an ordinary token).
  static SpecialTokens load_config(const std::filesystem::path& path, int32_t n_ranks);

  bool empty() const { return by_id_.empty(); }
  size_t size() const { return by_id_.size(); }
  int32_t max_id() const { return by_id_.empty() ? -1 : by_id_.rbegin()->first; }

  std::optional<int32_t> id(std::string_view text) const;
  // The smallest special id >= id, if any.
  std::optional<int32_t> first_id_from(int32_t id) const {
    const auto it = by_id_.lower_bound(id);
    if (it == by_id_.end()) return std::nullopt;
    return it->first;
  }
  const std::string* content(int32_t id) const;  // nullptr when id is not special

  struct Match {
    size_t pos, len;
    int32_t id;
  };
  // The leftmost occurrence of any special text in text[from..], the longest one at that position.
  std::optional<Match> find(std::string_view text, size_t from) const;

 private:
  std::map<std::string, int32_t, std::less<>> by_text_;
  std::map<int32_t, std::string> by_id_;
  std::vector<size_t> lengths_;  // distinct text lengths, longest first
  bool first_byte_[256] = {};
};

}  // namespace k3::io::text
