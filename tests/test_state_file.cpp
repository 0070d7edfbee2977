// pipeline/run/state_file (K3ST) with stages::DecodeState's compact layout: the bytes on disk are the
// reference engines' (kper floats for EVERY bound layer, MLA layers' slices zero) while memory holds
// the KDA layers only; save streams through a bounded buffer (its peak memory is measured on a
// real-size state); a failed save leaves neither the file nor its temporary.
#include <doctest/doctest.h>
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "io/config.hpp"
#include "io/error.hpp"
#include "io/k3_names.hpp"
#include "pipeline/run/state_file.hpp"
#include "stages/forward.hpp"
#include "tests/run_helpers.hpp"

namespace fs = std::filesystem;
using k3::pipeline::kStateHeaderBytes;
using k3::pipeline::load_state;
using k3::pipeline::save_state;
using k3::stages::DecodeState;
using k3::test::slurp;
using k3::test::TempDir;

namespace {

k3::io::ModelConfig tiny() {
  return k3::io::load_config(std::string(K3_FIXTURES) + "/tiny-k3/config.json");
}
k3::io::ModelConfig released() {
  return k3::io::parse_config(k3::io::k3_config_json(), "released config.json");
}

// A state whose every float says where it is: KDA layer l's i-th float, KV / rope rows.
void fill(DecodeState& st, size_t cached) {
  for (int l = 0; l < st.n_bound(); ++l) {
    std::span<float> s = st.kda_layer(l);
    for (size_t i = 0; i < s.size(); ++i) s[i] = float(l + 1) + float(i % 1000) * 1e-3f;
  }
  for (int m = 0; m < st.n_mla(); ++m) {
    std::span<float> kv = st.kv_rows(m, cached), rope = st.rope_rows(m, cached);
    for (size_t i = 0; i < kv.size(); ++i) kv[i] = -float(m + 1) - float(i % 777) * 1e-3f;
    for (size_t i = 0; i < rope.size(); ++i) rope[i] = 100.0f + float(m) + float(i % 333) * 1e-3f;
  }
  st.cached = cached;
}

std::vector<float> floats_at(const std::string& bytes, size_t offset, size_t n) {
  std::vector<float> v(n);
  REQUIRE(offset + 4 * n <= bytes.size());
  std::memcpy(v.data(), bytes.data() + offset, 4 * n);
  return v;
}

// Bytewise; an MLA layer's empty span (null data(), which memcmp must not be given) is equal.
bool same(std::span<const float> a, std::span<const float> b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size_bytes()) == 0);
}

uint64_t status_kb(const char* key) {
  std::ifstream f("/proc/self/status");
  std::string line;
  const std::string k = std::string(key) + ":";
  while (std::getline(f, line))
    if (line.rfind(k, 0) == 0) return std::strtoull(line.c_str() + k.size(), nullptr, 10);
  return 0;
}

// The names in `dir`, sorted (a temporary left behind shows here).
std::vector<std::string> entries(const fs::path& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

// save_state's io::Error message, or "<no error>" if it returned.
std::string save_error(const fs::path& path, const k3::io::ModelConfig& c, const std::vector<int32_t>& seq,
                       DecodeState& st) {
  try {
    save_state(path, c, seq, st);
  } catch (const k3::io::Error& e) {
    return e.what();
  }
  return "<no error>";
}

}  // namespace

TEST_CASE("DecodeState allocates KDA state for the KDA layers only, exactly the bytes StateSizes counts") {
  const k3::io::ModelConfig c = released();
  const auto sizes = k3::stages::StateSizes::of(c, c.n_layers, 128);
  CHECK(sizes.n_kda == 69);
  CHECK(sizes.n_mla == 24);
  CHECK(sizes.kper == 1'683'456);                     // the released K3ST header's kper
  CHECK(sizes.kda_bytes() == 69ull * 1'683'456 * 4);  // 443 MiB, not 93 layers' 626 MB
  CHECK(sizes.kv_position_bytes() == 2'365'440);      // 24 MLA layers x (24,576 + 64) floats
  DecodeState st(c, c.n_layers, 128);
  CHECK(st.allocated_bytes() == sizes.bytes());
  for (int l = 0; l < c.n_layers; ++l) {
    CAPTURE(l);
    CHECK(st.kda_layer(l).size() == (c.is_mla(l) ? 0 : sizes.kper));
  }
  // A run of the first few layers only (--layers): the same function, fewer layers.
  DecodeState part(c, 5, 7);
  CHECK(part.allocated_bytes() == k3::stages::StateSizes::of(c, 5, 7).bytes());
  CHECK(part.sizes().n_kda == 4);  // layer 3 (one-based 4) is MLA
}

TEST_CASE("K3ST bytes: kper floats for every bound layer at its index, MLA slices zero; load maps back") {
  const k3::io::ModelConfig c = tiny();
  const int n = c.n_layers;
  DecodeState st(c, n, 10);
  fill(st, 6);
  const std::vector<int32_t> seq = {5, 17, 250, 3, 3, 99, 7};
  TempDir d;
  const uint64_t bytes = save_state(d / "s.k3st", c, seq, st);
  const std::string file = slurp(d / "s.k3st");
  const size_t kper = st.kper(), kvpp = st.kvpp(), rpp = st.ropepp(), M = size_t(st.n_mla()), cached = 6;
  REQUIRE(file.size() == bytes);
  REQUIRE(bytes == kStateHeaderBytes + 4 * seq.size() + 4 * kper * n + 4 * cached * (kvpp + rpp) * M);
  CHECK(file.substr(0, 4) == "K3ST");
  auto i32 = [&](size_t at) {
    int32_t v;
    std::memcpy(&v, file.data() + at, 4);
    return v;
  };
  auto i64 = [&](size_t at) {
    int64_t v;
    std::memcpy(&v, file.data() + at, 8);
    return v;
  };
  CHECK(i32(4) == 1);
  CHECK(i32(56) == n);
  CHECK(i32(60) == int(M));
  CHECK(i32(64) == int(cached));
  CHECK(i32(68) == int(seq.size()));
  CHECK(i64(72) == int64_t(kper));
  CHECK(i64(80) == int64_t(kvpp));
  CHECK(i64(88) == int64_t(rpp));
  for (size_t i = 0; i < seq.size(); ++i) CHECK(i32(kStateHeaderBytes + 4 * i) == seq[i]);

  size_t at = kStateHeaderBytes + 4 * seq.size();
  for (int l = 0; l < n; ++l, at += 4 * kper) {
    CAPTURE(l);
    const std::vector<float> slice = floats_at(file, at, kper);
    if (c.is_mla(l))
      CHECK(std::all_of(slice.begin(), slice.end(), [](float x) { return x == 0.0f; }));
    else
      CHECK(same(slice, st.kda_layer(l)));
  }
  for (size_t m = 0; m < M; ++m, at += 4 * cached * kvpp)
    CHECK(same(floats_at(file, at, cached * kvpp), st.kv_rows(int(m), cached)));
  for (size_t m = 0; m < M; ++m, at += 4 * cached * rpp)
    CHECK(same(floats_at(file, at, cached * rpp), st.rope_rows(int(m), cached)));
  CHECK(at == file.size());

  // Back into a state of another capacity: every KDA slice and occupied row lands where it was.
  DecodeState back(c, n, 32);
  std::vector<int32_t> seq_back;
  load_state(d / "s.k3st", c, back, seq_back);
  CHECK(seq_back == seq);
  CHECK(back.cached == cached);
  for (int l = 0; l < n; ++l) CHECK(same(back.kda_layer(l), st.kda_layer(l)));
  for (int m = 0; m < int(M); ++m) {
    CHECK(same(back.kv_rows(m, cached), st.kv_rows(m, cached)));
    CHECK(same(back.rope_rows(m, cached), st.rope_rows(m, cached)));
  }
  // And out again: the same bytes.
  save_state(d / "t.k3st", c, seq_back, back);
  CHECK(slurp(d / "t.k3st") == file);
  CHECK(entries(d.path) == std::vector<std::string>{"s.k3st", "t.k3st"});
}

TEST_CASE("save_state streams: a 626 MB real-size state is saved with ~1 MiB of extra memory") {
  const k3::io::ModelConfig c = released();
  DecodeState st(c, c.n_layers, 40);
  fill(st, 16);
  std::vector<int32_t> seq(17);
  for (size_t i = 0; i < seq.size(); ++i) seq[i] = int32_t(i * 1000 + 1);
  TempDir d(fs::current_path(), "k3_state_");  // the build directory: real disk, not a tmpfs
  // Start the high-water mark at the current RSS, so that it measures this save alone.
  const bool reset = bool(std::ofstream("/proc/self/clear_refs") << "5");
  if (!reset) MESSAGE("/proc/self/clear_refs refused the reset: VmHWM may include earlier test cases");
  const uint64_t hwm_before = status_kb("VmHWM") * 1024, rss_before = status_kb("VmRSS") * 1024;
  const uint64_t bytes = save_state(d / "big.k3st", c, seq, st);
  const uint64_t hwm_after = status_kb("VmHWM") * 1024;
  MESSAGE("saved " << bytes << " B; VmRSS before " << rss_before << " B, VmHWM " << hwm_before << " -> "
                   << hwm_after << " B (+" << (hwm_after - hwm_before) << " B)");
  CHECK(bytes == fs::file_size(d / "big.k3st"));
  CHECK(bytes == 96 + 4 * 17 + 4ull * 1'683'456 * 93 + 16ull * 2'365'440);
  REQUIRE(hwm_before > 0);
#if defined(K3_SANITIZED)
  // ASan's shadow memory and quarantine move VmHWM by more than the buffer: not the engine's memory.
  MESSAGE("sanitized build (K3_SANITIZED): the VmHWM bound is skipped, ASan's shadow dominates it");
#else
  // Building the file in memory would add its 626 MB; the stream adds its buffer (plus noise).
  CHECK(hwm_after - hwm_before < 8 * k3::pipeline::kStateWriteBuffer);
#endif
  CHECK(entries(d.path) == std::vector<std::string>{"big.k3st"});
}

TEST_CASE("a failed save throws naming the path and leaves no file and no temporary") {
  const k3::io::ModelConfig c = tiny();
  DecodeState st(c, c.n_layers, 8);
  fill(st, 3);
  const std::vector<int32_t> seq = {1, 2, 3, 4};
  TempDir d;

  SUBCASE("the path is a directory") {
    fs::create_directory(d / "dir");
    const std::string what = save_error(d / "dir", c, seq, st);
    CHECK(what.find(d / "dir") != std::string::npos);
    CHECK(fs::is_directory(d / "dir"));
    CHECK(entries(d.path) == std::vector<std::string>{"dir"});
  }
  SUBCASE("the directory does not exist") {
    CHECK(save_error(d / "no/such/s.k3st", c, seq, st).find(d / "no/such/s.k3st") != std::string::npos);
    CHECK(entries(d.path).empty());
  }
  SUBCASE("the directory is not writable") {
    if (::geteuid() == 0) {
      MESSAGE("running as root: permissions do not stop writes, the non-writable case is skipped");
    } else {
      fs::create_directory(d / "ro");
      fs::permissions(d / "ro", fs::perms::owner_read | fs::perms::owner_exec);
      CHECK(save_error(d / "ro/s.k3st", c, seq, st).find(d / "ro/s.k3st") != std::string::npos);
      fs::permissions(d / "ro", fs::perms::owner_all);
      CHECK(entries(d / "ro").empty());
    }
  }
  SUBCASE("the disk refuses mid-file: the temporary is removed, an older file at the path survives") {
    // RLIMIT_FSIZE stands in for a full disk: writes past the limit fail with EFBIG (SIGXFSZ ignored).
    std::ofstream(d / "s.k3st") << "older";
    rlimit old{};
    REQUIRE(::getrlimit(RLIMIT_FSIZE, &old) == 0);
    const auto old_handler = ::signal(SIGXFSZ, SIG_IGN);
    rlimit small = old;
    small.rlim_cur = 2000;  // the header and the ids fit, the state does not
    REQUIRE(::setrlimit(RLIMIT_FSIZE, &small) == 0);
    const std::string what = save_error(d / "s.k3st", c, seq, st);
    ::setrlimit(RLIMIT_FSIZE, &old);
    ::signal(SIGXFSZ, old_handler);
    MESSAGE(what);
    CHECK(what.find(d / "s.k3st") != std::string::npos);
    CHECK(std::count(what.begin(), what.end(), '\n') == 0);
    CHECK(slurp(d / "s.k3st") == "older");
    CHECK(entries(d.path) == std::vector<std::string>{"s.k3st"});
  }
}

TEST_CASE("an empty state (no positions, no ids) saves and loads: 96 header bytes + the KDA state") {
  // Fuzzing finding: save_state passed the empty seq's null data() to memcpy (UBSan: null pointer
  // passed as argument 2) -- undefined behaviour the sanitizer build reports.
  const k3::io::ModelConfig c = tiny();
  DecodeState st(c, c.n_layers, 8);
  fill(st, 0);
  TempDir d;
  const uint64_t bytes = save_state(d / "empty.k3st", c, {}, st);
  CHECK(bytes == kStateHeaderBytes + 4 * st.kper() * size_t(c.n_layers));
  DecodeState back(c, c.n_layers, 8);
  std::vector<int32_t> seq = {7};
  load_state(d / "empty.k3st", c, back, seq);
  CHECK(seq.empty());
  CHECK(back.cached == 0);
  for (int l = 0; l < c.n_layers; ++l) CHECK(same(back.kda_layer(l), st.kda_layer(l)));
}
