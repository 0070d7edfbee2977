#include "pipeline/run/json_output.hpp"

#include <algorithm>

#include "io/text/xtml.hpp"

namespace k3::pipeline {

std::shared_ptr<const stages::TokenTable> json_token_table(const io::text::Tokenizer& tok,
                                                           int32_t model_vocab,
                                                           std::vector<int32_t> end_ids) {
  const int32_t n = std::min(model_vocab, tok.n_ids());
  std::vector<std::string> bytes(size_t(std::max(model_vocab, 0)));
  std::vector<bool> special(bytes.size(), false);
  for (int32_t id = 0; id < n; ++id) {
    special[size_t(id)] = tok.is_special(id);
    // Ids between the ranks and the specials that name nothing stay empty: never allowed.
    if (id < tok.n_ranks() || special[size_t(id)]) bytes[size_t(id)] = std::string(tok.token_bytes(id));
  }
  std::erase_if(end_ids, [&](int32_t id) { return id < 0 || id >= n; });
  return std::make_shared<stages::TokenTable>(std::move(bytes), std::move(special), std::move(end_ids));
}

std::string chat_reply_epilogue() {
  namespace text = io::text;
  const text::ChatMessage empty{text::ChatMessage::Role::assistant, "", std::nullopt};
  std::string closing = text::join(text::render_completion(empty, text::ChatOptions(false, "max")));
  if (closing.ends_with(text::kEndOfMsg)) closing.resize(closing.size() - text::kEndOfMsg.size());
  return closing;
}

}  // namespace k3::pipeline
