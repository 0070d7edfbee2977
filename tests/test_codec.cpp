// io/codec: lossless round trips for every bf16 bit pattern and weight-like data, every decode
// body against scalar, and corrupted streams refused by block and byte offset.
#include <doctest/doctest.h>
#include <tbb/global_control.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "io/codec/codec.hpp"
#include "io/error.hpp"
#include "kernels/dispatch.hpp"
#include "kernels/matmul.hpp"

using namespace k3::io;
using codec::Codec;
namespace kernels = k3::kernels;

namespace {

std::vector<std::byte> as_bytes(const std::vector<uint16_t>& v) {
  std::vector<std::byte> b(v.size() * 2);
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

uint16_t bf16_of(float f) {
  return uint16_t(std::bit_cast<uint32_t>(f) >> 16);
}

// Weight-like: N(0, scale) per row of 1024, scale drawn per row, with 1 in 1000 values x 40
// (outliers) and a few exact zeros.
std::vector<std::byte> weights(size_t n_bytes, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::uniform_real_distribution<float> ud(0.005f, 0.05f);
  std::vector<std::byte> out(n_bytes);
  float scale = ud(rng);
  for (size_t i = 0; i + 1 < n_bytes; i += 2) {
    if (i % 2048 == 0) scale = ud(rng);
    float x = nd(rng) * scale;
    if (rng() % 1000 == 0) x *= 40;
    if (rng() % 5000 == 0) x = 0;
    const uint16_t v = bf16_of(x);
    std::memcpy(out.data() + i, &v, 2);
  }
  if (n_bytes & 1) out.back() = std::byte{0xA5};
  return out;
}

void round_trip(const std::vector<std::byte>& raw, Codec c, uint32_t bv = 0) {
  const auto enc = codec::encode(raw, {.codec = c, .block_values = bv});
  const auto dec = codec::decode(enc, "test");
  REQUIRE(dec.size() == raw.size());
  CHECK(dec == raw);  // not memcmp: an empty round trip has null data pointers
}

std::string error_of(const std::vector<std::byte>& stream) {
  try {
    (void)codec::decode(stream, "s");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("every bf16 bit pattern round-trips byte for byte, both codecs, several block sizes") {
  std::vector<uint16_t> all(65536);
  for (uint32_t i = 0; i < 65536; ++i) all[i] = uint16_t(i);  // NaN, inf, denormals, -0 included
  std::vector<uint16_t> shuffled = all;
  std::shuffle(shuffled.begin(), shuffled.end(), std::mt19937(7));
  for (Codec c : {Codec::exp4, Codec::exp3, Codec::huff})
    for (uint32_t bv : {64u, 4096u, codec::max_block_values(c)}) {
      CAPTURE(codec::codec_name(c));
      CAPTURE(bv);
      round_trip(as_bytes(all), c, bv);
      round_trip(as_bytes(shuffled), c, bv);
    }
}

TEST_CASE("weight-like data of odd lengths and tails round-trips; the codecs save what they should") {
  for (size_t n :
       {size_t(0), size_t(1), size_t(2), size_t(3), size_t(127), size_t(128), size_t(129), size_t(8191),
        size_t(8192), size_t(8193), size_t(3 * 8192 + 63), size_t(131072 + 1), size_t(1 << 20)}) {
    CAPTURE(n);
    const auto raw = weights(n, uint32_t(n));
    for (Codec c : {Codec::exp4, Codec::exp3, Codec::huff}) {
      CAPTURE(codec::codec_name(c));
      round_trip(raw, c);
      round_trip(raw, c, 64);
    }
  }
  const auto raw = weights(size_t(4) << 20, 1);
  const double r4 = double(codec::encode(raw, {.codec = Codec::exp4}).size()) / double(raw.size());
  const double rh = double(codec::encode(raw, {.codec = Codec::huff}).size()) / double(raw.size());
  MESSAGE("weight-like 4 MiB: exp4 ratio " << r4 << ", huff ratio " << rh);
  CHECK(r4 < 0.78);  // 12 bits + escapes + headers
  CHECK(rh < r4);
  // One exponent only: huff codes it in 1 bit.
  std::vector<uint16_t> same(100000, 0x3F80);
  round_trip(as_bytes(same), Codec::huff);
  round_trip(as_bytes(same), Codec::exp4);
}

TEST_CASE("every exp4 decode body gives the scalar body's bytes") {
  const auto raw = weights((size_t(1) << 20) + 37, 3);  // tails inside blocks and an odd byte
  const auto enc = codec::encode(raw, {.codec = Codec::exp4, .block_values = 1024});
  const kernels::Isa was = kernels::active_isa();
  kernels::set_active_isa(kernels::Isa::scalar);
  const auto want = codec::decode(enc);
  for (kernels::Isa isa : codec::built_exp4_isas()) {
    if (!kernels::isa_supported(isa)) {
      MESSAGE("skipped: this CPU has no " << kernels::isa_name(isa));
      continue;
    }
    CAPTURE(kernels::isa_name(isa));
    kernels::set_active_isa(isa);
    const uint64_t before = codec::exp4_body_runs(isa);
    const auto got = codec::decode(enc);
    CHECK(codec::exp4_body_runs(isa) > before);
    CHECK(got == want);
  }
  kernels::set_active_isa(was);
  CHECK(want == raw);
}

// exp3 (3-bit codes, escapes without positions): blocks full of escapes of every kind -- zero,
// subnormal, inf, NaN, exponents just outside the window on both sides -- at random places, block
// sizes with a partial last code group, every body against scalar and against the input.
TEST_CASE("exp3: random blocks with escapes round-trip on every decode body") {
  std::mt19937 rng(31);
  std::normal_distribution<float> nd(0.f, 1.f);
  const uint16_t specials[] = {0x0000, 0x8000, 0x0001, 0x807F, 0x7F80,
                               0xFF80, 0x7FC0, 0xFFFF, 0x0080, 0x7F7F};
  for (int round = 0; round < 40; ++round) {
    const size_t n = 1 + rng() % 9000;
    const int esc_per_mille = int(rng() % 400);  // 0-40 % escapes
    std::vector<uint16_t> v(n);
    for (auto& x : v) {
      const int r = int(rng() % 1000);
      if (r < esc_per_mille / 2)
        x = specials[rng() % std::size(specials)];
      else if (r < esc_per_mille)
        x = bf16_of(nd(rng) * std::ldexp(1.f, int(rng() % 60) - 30));  // any exponent
      else
        x = bf16_of(nd(rng) * 0.02f);
    }
    const auto raw = as_bytes(v);
    for (uint32_t bv : {64u, 1024u, 4096u}) {
      CAPTURE(n);
      CAPTURE(bv);
      const auto enc = codec::encode(raw, {.codec = Codec::exp3, .block_values = bv});
      const kernels::Isa was = kernels::active_isa();
      for (kernels::Isa isa : codec::built_exp3_isas()) {
        if (!kernels::isa_supported(isa)) continue;
        CAPTURE(kernels::isa_name(isa));
        kernels::set_active_isa(isa);
        CHECK(codec::decode(enc) == raw);
      }
      kernels::set_active_isa(was);
    }
  }
}

TEST_CASE("every exp3 decode body gives the scalar body's bytes") {
  const auto raw = weights((size_t(1) << 20) + 37, 3);  // tails inside blocks and an odd byte
  const auto enc = codec::encode(raw, {.codec = Codec::exp3, .block_values = 1024});
  const kernels::Isa was = kernels::active_isa();
  kernels::set_active_isa(kernels::Isa::scalar);
  const auto want = codec::decode(enc);
  for (kernels::Isa isa : codec::built_exp3_isas()) {
    if (!kernels::isa_supported(isa)) {
      MESSAGE("skipped: this CPU has no " << kernels::isa_name(isa));
      continue;
    }
    CAPTURE(kernels::isa_name(isa));
    kernels::set_active_isa(isa);
    const uint64_t before = codec::exp3_body_runs(isa);
    const auto got = codec::decode(enc);
    CHECK(codec::exp3_body_runs(isa) > before);
    CHECK(got == want);
  }
  kernels::set_active_isa(was);
  CHECK(want == raw);
}

// N(0, 0.02), one scale for the tensor (an initialised model; synth's draw is as narrow): exp3
// stores 8 + 3 bits a value plus ~2 % escapes of one byte -- the >= 25 % the trunk needs.
TEST_CASE("exp3 saves over 25 % on normal weights with one scale, more than exp4") {
  std::mt19937 rng(37);
  std::normal_distribution<float> nd(0.f, 0.02f);
  std::vector<uint16_t> v(size_t(1) << 21);
  for (auto& x : v) x = bf16_of(nd(rng));
  const auto raw = as_bytes(v);
  const double r3 = double(codec::encode(raw, {.codec = Codec::exp3}).size()) / double(raw.size());
  const double r4 = double(codec::encode(raw, {.codec = Codec::exp4}).size()) / double(raw.size());
  MESSAGE("normal 4 MiB: exp3 ratio " << r3 << ", exp4 ratio " << r4);
  CHECK(r3 < 0.75);
  CHECK(r3 < r4);
  round_trip(raw, Codec::exp3);
}

TEST_CASE("two threads decoding disjoint block ranges give the one-thread bytes") {
  const auto raw = weights(size_t(3) << 20, 5);
  for (Codec c : {Codec::exp4, Codec::exp3, Codec::huff}) {
    const auto enc = codec::encode(raw, {.codec = c});
    const auto s = codec::Stream::parse(enc, "t");
    std::vector<std::byte> out(raw.size());
    const uint32_t mid = s.n_blocks() / 2;
    std::thread t([&] { s.decode_blocks(0, mid, out, true); });
    s.decode_blocks(mid, s.n_blocks(), out, true);
    t.join();
    CHECK(out == raw);
  }
}

TEST_CASE("a flipped bit anywhere in the header or the index is refused, naming the header") {
  const auto raw = weights(20000, 9);
  for (Codec c : {Codec::exp4, Codec::exp3, Codec::huff}) {
    const auto enc = codec::encode(raw, {.codec = c, .block_values = 4096});
    const size_t head = codec::kHeaderBytes + 3 * codec::kIndexEntryBytes;  // 3 blocks
    for (size_t bit = 0; bit < head * 8; ++bit) {
      auto bad = enc;
      bad[bit / 8] ^= std::byte(1u << (bit % 8));
      const std::string e = error_of(bad);
      CAPTURE(bit);
      REQUIRE_MESSAGE(!e.empty(), "a flipped header bit decoded");
      CHECK(e.find("header") != std::string::npos);
      CHECK(e.find("byte offset") != std::string::npos);
    }
  }
}

TEST_CASE("a flipped byte in a block is refused naming that block and its byte range") {
  const auto raw = weights(20000, 11);
  for (Codec c : {Codec::exp4, Codec::exp3, Codec::huff}) {
    const auto enc = codec::encode(raw, {.codec = c, .block_values = 4096});
    const size_t data = codec::kHeaderBytes + 3 * codec::kIndexEntryBytes;
    for (size_t at : {data, data + 1000, enc.size() - 1}) {
      auto bad = enc;
      bad[at] ^= std::byte{0x10};
      const std::string e = error_of(bad);
      CAPTURE(at);
      CHECK(e.find("check mismatch") != std::string::npos);
      // The range the message names contains the flipped byte.
      const size_t p = e.find("(bytes ");
      REQUIRE(p != std::string::npos);
      const size_t lo = std::stoull(e.substr(p + 7)), hi = std::stoull(e.substr(e.find("..", p) + 2));
      CHECK(lo <= at);
      CHECK(at < hi);
    }
  }
}

TEST_CASE("truncated streams are refused") {
  const auto raw = weights(20000, 13);
  for (Codec c : {Codec::exp4, Codec::exp3, Codec::huff}) {
    const auto enc = codec::encode(raw, {.codec = c, .block_values = 4096});
    for (size_t keep : {size_t(0), size_t(10), codec::kHeaderBytes, codec::kHeaderBytes + 20, enc.size() / 2,
                        enc.size() - 1}) {
      std::vector<std::byte> cut(enc.begin(), enc.begin() + ptrdiff_t(keep));
      CAPTURE(keep);
      CHECK(!error_of(cut).empty());
    }
    auto longer = enc;
    longer.push_back(std::byte{0});
    CHECK(error_of(longer).find("the stream at") != std::string::npos);
  }
}

TEST_CASE("structurally bad blocks with valid checks are refused by block and offset") {
  const auto raw = weights(20000, 17);
  const size_t data = codec::kHeaderBytes + 3 * codec::kIndexEntryBytes;
  SUBCASE("exp4: escape count") {
    auto bad = codec::encode(raw, {.codec = Codec::exp4, .block_values = 4096});
    bad[data + 2] = std::byte{0xFF};
    codec::reseal(bad);
    const std::string e = error_of(bad);
    CHECK(e.find("block 0: escape count") != std::string::npos);
    CHECK(e.find("byte offset " + std::to_string(data + 2)) != std::string::npos);
  }
  SUBCASE("exp4: base exponent out of range") {
    auto bad = codec::encode(raw, {.codec = Codec::exp4, .block_values = 4096});
    bad[data] = std::byte{250};
    codec::reseal(bad);
    CHECK(error_of(bad).find("base exponent 250") != std::string::npos);
  }
  SUBCASE("exp3: escape count") {
    auto bad = codec::encode(raw, {.codec = Codec::exp3, .block_values = 4096});
    bad[data + 2] = std::byte{0xFF};
    codec::reseal(bad);
    const std::string e = error_of(bad);
    CHECK(e.find("block 0: escape count") != std::string::npos);
    CHECK(e.find("byte offset " + std::to_string(data + 2)) != std::string::npos);
  }
  SUBCASE("exp3: base exponent out of range") {
    auto bad = codec::encode(raw, {.codec = Codec::exp3, .block_values = 4096});
    bad[data] = std::byte{250};
    codec::reseal(bad);
    CHECK(error_of(bad).find("base exponent 250") != std::string::npos);
  }
  SUBCASE("exp3: a code turned into an escape, the count unchanged") {
    auto bad = codec::encode(raw, {.codec = Codec::exp3, .block_values = 4096});
    const size_t codes = data + 4 + 4096;  // block 0's first code group: planes 0, 1, 2
    uint64_t p[3];
    std::memcpy(p, bad.data() + codes, sizeof p);
    const int j = std::countr_one(p[0] & p[1] & p[2]);  // the first value that is not an escape
    REQUIRE(j < 64);
    for (uint64_t& w : p) w |= uint64_t{1} << j;
    std::memcpy(bad.data() + codes, p, sizeof p);
    codec::reseal(bad);
    const std::string e = error_of(bad);
    CHECK(e.find("block 0: ") != std::string::npos);
    CHECK(e.find("escape") != std::string::npos);
  }
  SUBCASE("exp3: padding code bits") {
    // 20000 bytes = 10000 values: block 2 holds 1808, its last code group 16 of 64
    auto bad = codec::encode(raw, {.codec = Codec::exp3, .block_values = 4096});
    REQUIRE(codec::Stream::parse(bad, "t").n_blocks() == 3);
    uint64_t end1 = 0;  // block 2 starts where block 1 ends (the index's second entry)
    std::memcpy(&end1, bad.data() + codec::kHeaderBytes + codec::kIndexEntryBytes, 8);
    const size_t group = data + size_t(end1) + 4 + 1808 + (1808 / 64) * 24;  // its plane 0
    bad[group + 7] |= std::byte{0x80};                                       // value 63
    codec::reseal(bad);
    CHECK(error_of(bad).find("block 2: padding code bits are not 0") != std::string::npos);
  }
  SUBCASE("huff: code table") {
    auto bad = codec::encode(raw, {.codec = Codec::huff, .block_values = 4096});
    bad[data + 8 + 1] = std::byte{13};  // first symbol's length
    codec::reseal(bad);
    CHECK(error_of(bad).find("block 0: code length 13") != std::string::npos);
    bad[data + 8 + 1] = std::byte{1};
    codec::reseal(bad);
    CHECK(error_of(bad).find("complete prefix code") != std::string::npos);
  }
  SUBCASE("huff: code bytes count") {
    auto bad = codec::encode(raw, {.codec = Codec::huff, .block_values = 4096});
    bad[data + 4] = std::byte(std::to_integer<uint8_t>(bad[data + 4]) + 1);
    codec::reseal(bad);
    CHECK(error_of(bad).find("block 0:") != std::string::npos);
  }
}

TEST_CASE("random corruption with valid checks never decodes out of bounds: refused or decoded") {
  const auto raw = weights(30000, 19);
  std::mt19937 rng(23);
  int refused = 0;
  for (Codec c : {Codec::exp4, Codec::exp3, Codec::huff}) {
    const auto enc = codec::encode(raw, {.codec = c, .block_values = 1024});
    for (int it = 0; it < 3000; ++it) {
      auto bad = enc;
      for (int k = 0, n = 1 + int(rng() % 4); k < n; ++k)
        bad[rng() % bad.size()] ^= std::byte(1u << (rng() % 8));
      codec::reseal(bad);
      refused += !error_of(bad).empty();
    }
  }
  MESSAGE(refused << " of 9000 resealed corruptions refused (the rest changed only raw sign/mantissa bytes)");
  CHECK(refused > 0);
}

TEST_CASE("incompressible data is stored in raw blocks: it grows by the header, index and 4 bytes a block") {
  std::vector<std::byte> noise(100001);
  std::mt19937 rng(29);
  for (auto& b : noise) b = std::byte(rng() & 0xFF);
  for (Codec c : {Codec::exp4, Codec::exp3, Codec::huff}) {
    const auto enc = codec::encode(noise, {.codec = c, .block_values = 4096});
    const size_t blocks = (noise.size() / 2 + 4095) / 4096;
    CHECK(enc.size() <= noise.size() + codec::kHeaderBytes + blocks * (codec::kIndexEntryBytes + 4));
    CHECK(codec::decode(enc) == noise);
    auto bad = enc;  // a raw block whose header is not zero
    bad[codec::kHeaderBytes + blocks * codec::kIndexEntryBytes + 2] = std::byte{1};
    codec::reseal(bad);
    CHECK(error_of(bad).find("block 0: raw block") != std::string::npos);
  }
}

TEST_CASE("decode_values gives any range of the values, cut blocks included") {
  const auto raw = weights((size_t(200) << 10) + 1, 9);  // 100 blocks of 1024 values and a tail byte
  for (Codec c : {Codec::exp4, Codec::exp3, Codec::huff}) {
    CAPTURE(codec::codec_name(c));
    const auto enc = codec::encode(raw, {.codec = c, .block_values = 1024});
    const codec::Stream st = codec::Stream::parse(enc, "t");
    const uint64_t n = raw.size() / 2;
    for (auto [first_, count_] : std::vector<std::pair<uint64_t, uint64_t>>{
             {0, n}, {0, 1024}, {1024, 2048}, {5, 1}, {1023, 2}, {700, 5000}, {n - 3, 3}, {n, 0}}) {
      // CAPTURE's lambda needs variables: clang 14 cannot capture a structured binding.
      const uint64_t first = first_, count = count_;
      CAPTURE(first);
      CAPTURE(count);
      std::vector<uint16_t> got(count);
      st.decode_values(first, count, got.data());
      if (count) CHECK(std::memcmp(got.data(), raw.data() + 2 * first, 2 * count) == 0);
    }
    std::vector<uint16_t> one(2);
    CHECK_THROWS_AS(st.decode_values(n - 1, 2, one.data()), Error);
  }
}

// The fused decode's matvec (docs/codec.md): a coded matrix, decoded tile by tile inside the
// matmul, gives the plain bf16 matrix's bits for one token and several, with every body.
TEST_CASE("a CodedBf16Matrix multiplies to the Bf16Matrix bits") {
  const size_t rows = 300, cols = 1000, lead = 777;  // the matrix starts inside a block
  const auto image = weights(2 * (lead + rows * cols + 500), 21);
  const auto enc = codec::encode(image, {.codec = Codec::exp4, .block_values = 1024});
  const codec::Stream st = codec::Stream::parse(enc, "t");
  std::vector<uint16_t> w(rows * cols);
  std::memcpy(w.data(), image.data() + 2 * lead, w.size() * 2);
  const kernels::Bf16Matrix plain{w, rows, cols};
  const kernels::CodedBf16Matrix coded{.src = &st, .first = lead, .rows = rows, .cols = cols};
  std::mt19937 rng(4);
  std::normal_distribution<float> nd(0.f, 1.f);
  const size_t tokens = 5;
  std::vector<float> x(tokens * cols);
  for (float& v : x) v = nd(rng);
  const kernels::Isa was = kernels::active_isa();
  for (kernels::Isa isa : kernels::supported_isas()) {
    CAPTURE(kernels::isa_name(isa));
    kernels::set_active_isa(isa);
    for (size_t t : {size_t(1), tokens}) {
      CAPTURE(t);
      std::vector<float> want(t * rows), got(t * rows, -1.f);
      kernels::matmul(plain, std::span(x).first(t * cols), t, want);
      kernels::matmul(coded, std::span(x).first(t * cols), t, got);
      CHECK(std::memcmp(want.data(), got.data(), want.size() * 4) == 0);
    }
    CHECK(kernels::dot_row(coded, 123, x) == kernels::dot_row(plain, 123, x));
  }
  kernels::set_active_isa(was);
}

namespace {

void put_bf16(std::vector<std::byte>& img, size_t i, uint16_t v) {
  std::memcpy(img.data() + 2 * i, &v, 2);
}

// Weight-like values for the fused exp3 body, with: block 1 of random bits (no exponent 255, so the
// products stay finite: coding cannot shrink it, it is stored raw), block 2 half escapes (values
// far outside the window), and zeros (escapes: the window sits near exponent 120) on the first
// and last value of every third group.
std::vector<std::byte> exp3_image(size_t n_values, uint32_t bv, uint32_t seed) {
  auto img = weights(2 * n_values, seed);
  std::mt19937 rng(seed);
  const size_t n_blocks = n_values / bv;
  for (size_t i = bv; i < 2 * size_t(bv) && n_blocks > 1; ++i) {
    auto v = uint16_t(rng());
    if ((v & 0x7F80) == 0x7F80) v &= 0xBFFF;
    put_bf16(img, i, v);
  }
  for (size_t i = 2 * size_t(bv); i < 3 * size_t(bv) && n_blocks > 2; ++i)
    if (rng() % 2) put_bf16(img, i, uint16_t((rng() % 2) << 15 | (20 + rng() % 200) << 7 | (rng() & 0x7F)));
  for (size_t g = 0; g * 64 + 63 < n_values; g += 3) {
    put_bf16(img, g * 64, 0);
    put_bf16(img, g * 64 + 63, 0x8000);
  }
  return img;
}

}  // namespace

// The fused exp3 body (docs/codec.md, "Fused exp3 body"): straight from the stored blocks, the
// Bf16Matrix bits for rows that start mid-block and mid-group, widths that are not multiples of
// 16 or 64, rows spanning many blocks, raw-stored blocks and escapes (first and last value of a
// group, half a block), 1..9 tokens, 1 and 2 threads, every ISA (the others take the tile path).
TEST_CASE("the fused exp3 body multiplies to the Bf16Matrix bits") {
  struct Shape {
    uint32_t bv;
    size_t rows, cols, lead;
  };
  const kernels::Isa was = kernels::active_isa();
  const uint64_t runs0 = kernels::exp3_direct_runs(), refused0 = kernels::exp3_direct_refused();
  bool saw_raw = false, saw_many = false, saw_edges = false;
  // (one token, whole groups and a start at a multiple of 16: the in-register body, phases 0, 16, 48, 32)
  for (const Shape sh :
       {Shape{1024, 150, 1000, 777}, Shape{4096, 70, 4096, 0}, Shape{1024, 100, 2112, 208},
        Shape{64, 13, 128, 240}, Shape{4096, 20, 2048, 4128}, Shape{64, 67, 600, 1}, Shape{1024, 9, 13, 3}}) {
    CAPTURE(sh.bv);
    CAPTURE(sh.cols);
    CAPTURE(sh.lead);
    const size_t n = sh.lead + sh.rows * sh.cols + 100;
    const auto image = exp3_image(n, sh.bv, uint32_t(sh.cols));
    const auto enc = codec::encode(image, {.codec = Codec::exp3, .block_values = sh.bv});
    const codec::Stream st = codec::Stream::parse(enc, "t");
    std::vector<kernels::Exp3Block> blocks;
    REQUIRE(st.exp3_blocks(sh.lead, sh.rows * sh.cols, blocks));
    for (const auto& b : blocks) {  // what the image is for, inside the matrix
      saw_raw |= b.raw != nullptr;
      saw_many |= b.raw == nullptr && b.n_esc > b.n / 3;
      for (size_t g = 0; b.raw == nullptr && g < b.n / 64; ++g) {
        uint64_t p[3];
        std::memcpy(p, b.planes + 24 * g, 24);
        saw_edges |= ((p[0] & p[1] & p[2]) >> 63 & 1) && ((p[0] & p[1] & p[2]) & 1);
      }
    }
    std::vector<uint16_t> w(sh.rows * sh.cols);
    std::memcpy(w.data(), image.data() + 2 * sh.lead, w.size() * 2);
    const kernels::Bf16Matrix plain{w, sh.rows, sh.cols};
    const kernels::CodedBf16Matrix coded{.src = &st, .first = sh.lead, .rows = sh.rows, .cols = sh.cols};
    std::mt19937 rng(5);
    std::normal_distribution<float> nd(0.f, 1.f);
    std::vector<float> x(9 * sh.cols);
    for (float& v : x) v = nd(rng);
    for (kernels::Isa isa : kernels::supported_isas()) {
      CAPTURE(kernels::isa_name(isa));
      kernels::set_active_isa(isa);
      for (int threads : {1, 2}) {
        CAPTURE(threads);
        tbb::global_control gc(tbb::global_control::max_allowed_parallelism, size_t(threads));
        for (size_t t = 1; t <= 9; ++t) {
          CAPTURE(t);
          std::vector<float> want(t * sh.rows), got(t * sh.rows, -1.f);
          kernels::matmul(plain, std::span(x).first(t * sh.cols), t, want);
          kernels::matmul(coded, std::span(x).first(t * sh.cols), t, got);
          CHECK(std::memcmp(want.data(), got.data(), want.size() * 4) == 0);
        }
      }
      const float a = kernels::dot_row(coded, sh.rows - 1, x), b = kernels::dot_row(plain, sh.rows - 1, x);
      CHECK(std::memcmp(&a, &b, 4) == 0);
    }
  }
  kernels::set_active_isa(was);
  CHECK(saw_raw);
  CHECK(saw_many);
  CHECK(saw_edges);
  CHECK(kernels::exp3_direct_refused() == refused0);  // every task computed by the body it went to
  if (kernels::exp3_direct_available()) {
    CHECK(kernels::exp3_direct_runs() > runs0);
  } else {
    MESSAGE("the fused exp3 body needs AVX-512 VBMI and VBMI2, which this CPU lacks: only the tile path ran");
  }
}

// A block whose planes code one escape more than its list holds: the fused body stops before
// reading past the list and the tile path refuses the block.
TEST_CASE("the fused exp3 body never reads past a malformed block's escape list") {
  const size_t rows = 8, cols = 1024;
  auto image = weights(2 * rows * cols, 31);
  auto enc = codec::encode(image, {.codec = Codec::exp3, .block_values = 1024});
  {
    const codec::Stream st = codec::Stream::parse(enc, "t");
    std::vector<kernels::Exp3Block> blocks;
    REQUIRE(st.exp3_blocks(3 * cols, cols, blocks));
    REQUIRE(blocks.size() == 1);
    REQUIRE(blocks[0].raw == nullptr);
    const size_t at = size_t(blocks[0].planes - reinterpret_cast<const uint8_t*>(enc.data()));
    uint64_t p[3];
    std::memcpy(p, enc.data() + at, 24);
    const uint64_t plain_value = ~(p[0] & p[1] & p[2]) & -~(p[0] & p[1] & p[2]);  // lowest non-escape
    for (uint64_t& word : p) word |= plain_value;
    std::memcpy(enc.data() + at, p, 24);
  }
  const codec::Stream st = codec::Stream::parse(enc, "t");
  const kernels::CodedBf16Matrix coded{.src = &st, .first = 0, .rows = rows, .cols = cols};
  std::vector<float> x(cols, 1.f), y(rows);
  const kernels::Isa was = kernels::active_isa();
  const uint64_t refused0 = kernels::exp3_direct_refused();
  for (kernels::Isa isa : kernels::supported_isas()) {
    CAPTURE(kernels::isa_name(isa));
    kernels::set_active_isa(isa);
    CHECK_THROWS_AS(kernels::matvec(coded, x, y), Error);
  }
  kernels::set_active_isa(was);
  if (kernels::exp3_direct_available()) CHECK(kernels::exp3_direct_refused() > refused0);
}
