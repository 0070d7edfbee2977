// Token ids given on the command line (`--ids` of generate, bench and detokenize): one rule set for
// every command, so "1 2", "1,2" and "1, 2" mean the same thing everywhere.
#pragma once
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

namespace k3::pipeline {

// Items separated by commas and/or whitespace (space, tab, CR, LF); each a non-negative decimal
// integer that fits int32 (no sign, no fraction). An empty list (no items, e.g. "" or " , ") is
// refused unless allow_empty (generate --load-state resumes with no new ids). vocab > 0: each id
// must also be below it; 0 means the vocabulary is not known yet (check later with
// check_ids_in_vocab). Every refusal is an io::usage_error naming `flag` and the bad item.
std::vector<int32_t> parse_id_list(std::string_view text, std::string_view flag, int64_t vocab = 0,
                                   bool allow_empty = false);

// The vocabulary rule alone, once it is known: each id < vocab, else a usage error naming `flag`.
void check_ids_in_vocab(std::span<const int32_t> ids, int64_t vocab, std::string_view flag);

}  // namespace k3::pipeline
