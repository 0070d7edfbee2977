#include "io/text/vocab.hpp"

#include <fmt/format.h>

#include <array>
#include <cstddef>
#include <span>

#include "io/aligned.hpp"
#include "io/error.hpp"
#include "io/file.hpp"

namespace k3::io::text {
namespace {

constexpr uint32_t kUnset = UINT32_MAX;

// int, not int8_t: the -1 sentinel is tested after widening, and a signed char widened to int is
// what clang-tidy's bugprone-signed-char-misuse asks us not to rely on.
constexpr std::array<int, 256> base64_table() {
  std::array<int, 256> t{};
  for (auto& v : t) v = -1;
  constexpr std::string_view alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  for (size_t i = 0; i < alphabet.size(); ++i) t[uint8_t(alphabet[i])] = int(i);
  return t;
}
constexpr std::array<int, 256> kBase64 = base64_table();

// Standard padded base64 (what tiktoken writes). Appends the bytes to `out`; false when `in` is not
// a whole number of 4-character groups over the alphabet with at most two '=' at its very end.
bool base64_decode(std::string_view in, std::string& out) {
  if (in.empty() || in.size() % 4 != 0) return false;
  size_t pad = 0;
  if (in.back() == '=') pad = in[in.size() - 2] == '=' ? 2 : 1;
  const size_t groups = in.size() / 4;
  const auto* s = reinterpret_cast<const unsigned char*>(in.data());
  for (size_t g = 0; g < groups; ++g, s += 4) {
    const bool last = g + 1 == groups;
    const int a = kBase64[s[0]], b = kBase64[s[1]];
    const int c = last && pad == 2 ? 0 : kBase64[s[2]];
    const int d = last && pad >= 1 ? 0 : kBase64[s[3]];
    if ((a | b | c | d) < 0) return false;
    const uint32_t v = (uint32_t(a) << 18) | (uint32_t(b) << 12) | (uint32_t(c) << 6) | uint32_t(d);
    out.push_back(char(v >> 16));
    if (!(last && pad == 2)) out.push_back(char(v >> 8));
    if (!(last && pad >= 1)) out.push_back(char(v));
  }
  return true;
}

// The whole file in one huge-page-advised buffer (the rank file of a 200k vocabulary is 3.6 MB).
io::AlignedBuffer read_all(const std::filesystem::path& path, size_t& size) {
  const File f = File::open_read(path, File::Mode::buffered);
  size = f.size();
  io::AlignedBuffer buf(size + 1);
  f.read_exact(0, buf.bytes().first(size));
  return buf;
}

// The lines of `buf` without their '\n' and a trailing '\r', numbered from 1; `fn(line, number)`.
template <class Fn>
void for_each_line(std::string_view buf, Fn fn) {
  size_t pos = 0;
  for (uint32_t number = 1; pos < buf.size(); ++number) {
    size_t end = buf.find('\n', pos);
    if (end == std::string_view::npos) end = buf.size();
    std::string_view line = buf.substr(pos, end - pos);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    fn(line, number);
    pos = end + 1;
  }
}

}  // namespace

Vocab Vocab::load(const std::filesystem::path& path) {
  size_t file_size = 0;
  const io::AlignedBuffer file = read_all(path, file_size);
  const std::string_view buf(reinterpret_cast<const char*>(file.data()), file_size);
  const std::string where = path.string();
  auto fail = [&](uint32_t line, const std::string& why) {
    return io::runtime_error(fmt::format("{}:{}: {}", where, line, why));
  };
  // The line a rank or a token was first given on, found again only for a message.
  auto first_line = [&](int32_t rank) {
    uint32_t found = 0;
    const std::string suffix = " " + std::to_string(rank);
    for_each_line(buf, [&](std::string_view line, uint32_t number) {
      if (!found && line.ends_with(suffix) && line.find(' ') == line.size() - suffix.size()) found = number;
    });
    return found;
  };

  // First pass: how many tokens (for the dense-rank check and the table size) and how many bytes.
  size_t n_tokens = 0, n_bytes = 0;
  for_each_line(buf, [&](std::string_view line, uint32_t) {
    n_tokens += !line.empty();
    n_bytes += line.size();
  });
  if (n_tokens == 0) throw io::runtime_error(where + ": empty rank file (no `base64 rank` lines)");
  if (n_tokens > size_t(INT32_MAX)) throw io::runtime_error(where + ": more than 2^31 ranks");

  Vocab v;
  v.arena_.reserve(n_bytes);  // base64 decodes to fewer bytes than the lines hold
  v.spans_.assign(n_tokens, Span{kUnset, 0});
  size_t cap = 512;
  while (cap < 2 * n_tokens) cap <<= 1;  // load factor <= 1/2: a miss, common in BPE, ends soon
  v.slot_memory_ = io::AlignedBuffer(cap * sizeof(Slot));
  Slot* slots = reinterpret_cast<Slot*>(v.slot_memory_.data());
  v.slots_ = slots;
  v.mask_ = cap - 1;
  v.pairs_.assign(size_t(1) << 16, -1);
  v.filter_.assign(kFilterWords, 0);

  for_each_line(buf, [&](std::string_view line, uint32_t number) {
    if (line.empty()) return;
    const size_t sp = line.find(' ');
    if (sp == std::string_view::npos) throw fail(number, "expected `base64 rank`, found no space");
    const std::string_view b64 = line.substr(0, sp), rank_text = line.substr(sp + 1);
    if (b64.empty()) throw fail(number, "empty token (nothing before the space)");

    if (rank_text.empty()) throw fail(number, "missing rank after the space");
    const bool negative = rank_text[0] == '-';
    const std::string_view digits = rank_text.substr(negative ? 1 : 0);
    if (digits.empty() || digits.find_first_not_of("0123456789") != std::string_view::npos)
      throw fail(number, fmt::format("rank `{}` is not a decimal number", rank_text));
    if (negative) throw fail(number, fmt::format("rank {} is negative", rank_text));
    uint64_t rank = 0;
    for (const char c : digits) {
      rank = rank * 10 + uint64_t(c - '0');
      if (rank >= (uint64_t(1) << 31))
        throw fail(number, fmt::format("rank {} is not below 2^31", rank_text));
    }
    if (rank >= n_tokens)
      throw fail(number, fmt::format("rank {} out of range: {} tokens must have the ranks 0..{}", rank,
                                     n_tokens, n_tokens - 1));
    if (v.spans_[rank].off != kUnset)
      throw fail(number, fmt::format("rank {} repeats (first on line {})", rank, first_line(int32_t(rank))));

    const size_t off = v.arena_.size();
    if (!base64_decode(b64, v.arena_)) throw fail(number, fmt::format("`{}` is not valid base64", b64));
    const size_t len = v.arena_.size() - off;
    if (len == 0) throw fail(number, "empty token (base64 of no bytes)");
    const char* bytes = v.arena_.data() + off;
    if (const int32_t prior = v.find(bytes, len); prior >= 0)
      throw fail(number, fmt::format("token `{}` repeats: it already has rank {} (line {})", b64, prior,
                                     first_line(prior)));
    const uint64_t h = hash(bytes, len);
    size_t i = h & v.mask_;
    while (slots[i].tag != 0) i = (i + 1) & v.mask_;
    slots[i] = Slot{slot_tag(h, len), uint32_t(rank), load_head(bytes, len)};
    v.filter_[(h >> 6) & (kFilterWords - 1)] |= filter_bits(h);
    if (len == 2) v.pairs_[(uint8_t(bytes[0]) << 8) | uint8_t(bytes[1])] = int32_t(rank);
    v.spans_[rank] = Span{uint32_t(off), uint32_t(len)};
  });

  for (int b = 0; b < 256; ++b) {
    const char c = char(b);
    v.byte_ranks_[b] = v.find(&c, 1);
    if (v.byte_ranks_[b] < 0)
      throw io::runtime_error(
          fmt::format("{}: no token for the single byte 0x{:02X} (rank BPE needs all 256 bytes)", where, b));
  }
  return v;
}

}  // namespace k3::io::text
