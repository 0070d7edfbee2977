#include "io/text/bpe.hpp"

#include <algorithm>
#include <functional>
#include <queue>

namespace k3::io::text {
namespace {

constexpr uint32_t kNone = UINT32_MAX;  // "not a token": above every rank (ranks are < 2^31)

// Pieces up to this many bytes use the scan form; measured on the fixture corpora, the scan form
// wins below it and the heap form above.
constexpr size_t kScanLimit = 96;

uint32_t rank_of(const Vocab& v, const char* p, size_t n) {
  const int32_t r = v.find(p, n);
  return r < 0 ? kNone : uint32_t(r);
}

}  // namespace

void bpe_merge_scan(const Vocab& vocab, std::string_view piece, std::vector<int32_t>& out) {
  const char* s = piece.data();
  const size_t n = piece.size();
  // parts[k] = {start, rank of the pair starting there (its bytes up to parts[k + 2].start)};
  // tokens[k] = the rank of part k itself. The last two parts are sentinels.
  struct Part {
    uint32_t start, pair_rank;
  };
  // Short pieces (all that bpe_encode sends here) stay on the stack.
  Part parts_local[kScanLimit + 1];
  uint32_t tokens_local[kScanLimit + 1];
  std::vector<Part> parts_long;
  std::vector<uint32_t> tokens_long;
  Part* parts = parts_local;
  uint32_t* tokens = tokens_local;
  if (n > kScanLimit) {
    parts_long.resize(n + 1);
    tokens_long.resize(n + 1);
    parts = parts_long.data();
    tokens = tokens_long.data();
  }
  for (size_t k = 0; k + 1 < n; ++k) parts[k] = {uint32_t(k), rank_of(vocab, s + k, 2)};
  parts[n - 1] = {uint32_t(n - 1), kNone};
  parts[n] = {uint32_t(n), kNone};
  for (size_t k = 0; k < n; ++k) tokens[k] = uint32_t(vocab.byte_rank(uint8_t(s[k])));
  size_t count = n + 1;

  // The rank of part k merged with its right neighbour and that one's right neighbour's bytes, read
  // before parts[k + 1] is removed (hence k + 3).
  auto rank_after_merge = [&](size_t k) {
    if (k + 3 >= count) return kNone;
    return rank_of(vocab, s + parts[k].start, parts[k + 3].start - parts[k].start);
  };
  for (;;) {
    uint32_t best = kNone;
    size_t at = 0;
    for (size_t k = 0; k + 1 < count; ++k)
      if (parts[k].pair_rank < best) best = parts[k].pair_rank, at = k;  // strict: leftmost on ties
    if (best == kNone) break;
    tokens[at] = best;
    if (at > 0) parts[at - 1].pair_rank = rank_after_merge(at - 1);
    parts[at].pair_rank = rank_after_merge(at);
    std::copy(parts + at + 2, parts + count, parts + at + 1);
    std::copy(tokens + at + 2, tokens + count, tokens + at + 1);
    --count;
  }
  for (size_t k = 0; k + 1 < count; ++k) out.push_back(int32_t(tokens[k]));
}

void bpe_merge_heap(const Vocab& vocab, std::string_view piece, std::vector<int32_t>& out) {
  const char* s = piece.data();
  const uint32_t n = uint32_t(piece.size());
  // Node k starts at byte k and never moves its start; merging absorbs the right neighbour.
  // pair_rank = the rank of node + next (kNone at the last node); token = the node's own rank.
  struct Node {
    uint32_t end, prev, next, pair_rank, token;
    bool alive;
  };
  std::vector<Node> nodes(n);
  for (uint32_t k = 0; k < n; ++k)
    nodes[k] = {k + 1,
                k == 0 ? kNone : k - 1,
                k + 1 < n ? k + 1 : kNone,
                k + 1 < n ? rank_of(vocab, s + k, 2) : kNone,
                uint32_t(vocab.byte_rank(uint8_t(s[k]))),
                true};

  // Key = rank << 32 | start: the lowest rank first, then the leftmost, as the scan form chooses.
  // An entry is stale when its node died or its pair rank changed since; a node's pair only ever
  // grows to the right, so a (node, rank) pair cannot come back after it changed.
  std::vector<uint64_t> heap_storage;
  heap_storage.reserve(2 * size_t(n));
  std::priority_queue<uint64_t, std::vector<uint64_t>, std::greater<>> heap(std::greater<>{},
                                                                            std::move(heap_storage));
  auto push = [&](uint32_t k) {
    if (nodes[k].pair_rank != kNone) heap.push((uint64_t(nodes[k].pair_rank) << 32) | k);
  };
  auto pair_rank = [&](uint32_t k) {
    const uint32_t nx = nodes[k].next;
    if (nx == kNone) return kNone;
    return rank_of(vocab, s + k, nodes[nx].end - k);
  };
  for (uint32_t k = 0; k < n; ++k) push(k);

  while (!heap.empty()) {
    const uint64_t top = heap.top();
    heap.pop();
    const uint32_t k = uint32_t(top), rank = uint32_t(top >> 32);
    Node& node = nodes[k];
    if (!node.alive || node.pair_rank != rank) continue;
    const uint32_t nx = node.next;
    node.token = rank;
    node.end = nodes[nx].end;
    node.next = nodes[nx].next;
    nodes[nx].alive = false;
    if (node.next != kNone) nodes[node.next].prev = k;
    node.pair_rank = pair_rank(k);
    push(k);
    if (node.prev != kNone) {
      nodes[node.prev].pair_rank = pair_rank(node.prev);
      push(node.prev);
    }
  }
  for (uint32_t k = 0; k != kNone; k = nodes[k].next) out.push_back(int32_t(nodes[k].token));
}

void bpe_encode(const Vocab& vocab, std::string_view piece, std::vector<int32_t>& out) {
  const int32_t whole = vocab.find(piece);
  if (whole >= 0) {
    out.push_back(whole);
  } else if (piece.size() <= kScanLimit) {
    bpe_merge_scan(vocab, piece, out);
  } else {
    bpe_merge_heap(vocab, piece, out);
  }
}

}  // namespace k3::io::text
