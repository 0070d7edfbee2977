#include "io/text/text_stream.hpp"

#include <algorithm>

namespace k3::io::text {

std::vector<int32_t> end_of_turn_ids(const Tokenizer& tok) {
  std::vector<int32_t> ids;
  for (const char* name : {"[EOS]", "<|end_of_msg|>"})
    if (const auto id = tok.special_id(name)) ids.push_back(*id);
  return ids;
}

TextStream::TextStream(const Tokenizer& tok, std::vector<int32_t> stop_ids,
                       std::vector<std::string> stop_strings)
    : dec_(tok), stop_ids_(std::move(stop_ids)), stop_strings_(std::move(stop_strings)) {
  std::erase_if(stop_strings_, [](const std::string& s) { return s.empty(); });
}

TextStream::Out TextStream::push(int32_t id) {
  if (stopped_) return {{}, true};
  if (std::find(stop_ids_.begin(), stop_ids_.end(), id) != stop_ids_.end()) {
    // The end id itself is not text; what the decoder still holds is an unfinished code point.
    Out out{held_ + dec_.finish(), true};
    held_.clear();
    stopped_ = true;
    return out;
  }
  held_ += dec_.push(id);
  return release();
}

TextStream::Out TextStream::release() {
  // The earliest stop string ends the text.
  size_t cut = std::string::npos;
  for (const std::string& s : stop_strings_) cut = std::min(cut, held_.find(s));
  if (cut != std::string::npos) {
    Out out{held_.substr(0, cut), true};
    held_.clear();
    stopped_ = true;
    return out;
  }
  // Hold back the longest tail of held_ that is a proper prefix of some stop string. Cutting only
  // at the start of such a tail keeps UTF-8 whole: the tail starts where a stop string starts.
  size_t keep = 0;
  for (const std::string& s : stop_strings_)
    for (size_t n = std::min(s.size() - 1, held_.size()); n > keep; --n)
      if (held_.compare(held_.size() - n, n, s, 0, n) == 0) {
        keep = n;
        break;
      }
  Out out{held_.substr(0, held_.size() - keep), false};
  held_.erase(0, held_.size() - keep);
  return out;
}

std::string TextStream::finish() {
  if (stopped_) return {};
  std::string out = held_ + dec_.finish();
  held_.clear();
  return out;
}

}  // namespace k3::io::text
