// Rank BPE, as tiktoken does it: start from the piece's single bytes and repeatedly merge the
// adjacent pair whose concatenation has the lowest rank (the leftmost such pair on a tie) until no
// adjacent pair is a token. There is no merges list: the ranks are the merge order.
#pragma once
#include <cstdint>
#include <string_view>
#include <vector>

#include "io/text/vocab.hpp"

namespace k3::io::text {

// Appends the ids of `piece` (non-empty). A piece that is itself a token is one id.
void bpe_encode(const Vocab& vocab, std::string_view piece, std::vector<int32_t>& out);

// The two forms bpe_encode chooses between by length; both give identical results (tested). The
// scan form is tiktoken's (a vector of parts, a linear search for the lowest rank per merge): fast
// for short pieces, quadratic for long ones. The heap form (linked parts, a min-heap keyed by rank
// then position) is O(n log n).
void bpe_merge_scan(const Vocab& vocab, std::string_view piece, std::vector<int32_t>& out);
void bpe_merge_heap(const Vocab& vocab, std::string_view piece, std::vector<int32_t>& out);

}  // namespace k3::io::text
