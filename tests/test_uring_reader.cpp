// io/uring_reader: real files in the build directory (not tmpfs: O_DIRECT must really be in effect
// where the filesystem allows it), many concurrent requests at awkward sizes, both backends,
// errors that must complete (never hang) and shutdown with reads in flight.
#include <doctest/doctest.h>
#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "io/aligned.hpp"
#include "io/error.hpp"
#include "io/file.hpp"
#include "io/uring_reader.hpp"

namespace fs = std::filesystem;
using k3::io::AlignedBuffer;
using k3::io::File;
using k3::io::ReadCompletion;
using k3::io::ReadRequest;
using k3::io::UringReader;

namespace {

constexpr size_t kFileBytes = size_t{64} << 20;

uint64_t splitmix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// The pattern file, written once per test run in the working (build) directory.
struct Pattern {
  fs::path path;
  std::vector<std::byte> bytes;
  Pattern() : path(fs::absolute("uring_reader_pattern.bin")), bytes(kFileBytes) {
    for (size_t i = 0; i < kFileBytes / 8; ++i) {
      uint64_t v = splitmix(i);
      std::memcpy(&bytes[i * 8], &v, 8);
    }
    write_file(path, bytes);
  }
  ~Pattern() { fs::remove(path); }
  static void write_file(const fs::path& p, std::span<const std::byte> b) {
    int fd = ::open(p.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    REQUIRE(fd >= 0);
    size_t done = 0;
    while (done < b.size()) {
      ssize_t w = ::write(fd, b.data() + done, b.size() - done);
      REQUIRE(w > 0);
      done += size_t(w);
    }
    ::fdatasync(fd);
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);  // read cold where the kernel obliges
    ::close(fd);
  }
};

const Pattern& pattern() {
  static Pattern p;
  return p;
}

// Collects completions; checks each tag completes exactly once.
struct Sink {
  std::mutex mu;
  std::condition_variable cv;
  std::map<uint64_t, int> calls;
  std::map<uint64_t, ReadCompletion> last;
  std::atomic<size_t> total{0};

  UringReader::Callback callback() {
    return [this](const ReadCompletion& c) {
      std::lock_guard lk(mu);
      ++calls[c.tag];
      last[c.tag] = c;
      ++total;
      cv.notify_all();
    };
  }
  bool wait_for(size_t n, std::chrono::seconds limit) {
    std::unique_lock lk(mu);
    return cv.wait_for(lk, limit, [&] { return total >= n; });
  }
};

struct Case {
  uint64_t offset;
  size_t length;
  size_t dst_shift;  // destination = aligned buffer + dst_shift
};

// Aligned, unaligned, multi-chunk, head/body/tail (offset and address agree mod 4096), tiny, empty.
std::vector<Case> awkward_cases() {
  std::vector<Case> cs = {
      {0, 4096, 0},
      {4096 * 3, size_t{20} << 20, 0},  // several 8 MiB chunks, all O_DIRECT
      {1, 1, 0},
      {12345, 777777, 0},                        // unaligned offset, buffered
      {8192 + 100, (size_t{9} << 20) + 5, 100},  // head + O_DIRECT body + tail
      {kFileBytes - 4096, 4096, 0},              // last page
      {kFileBytes - 13, 13, 7},                  // ends exactly at EOF
      {0, 0, 0},                                 // empty request still completes
      {(size_t{1} << 20) - 1, (size_t{3} << 20) + 2, 4095},
  };
  std::mt19937_64 rng(42);
  for (int i = 0; i < 40; ++i) {
    size_t len = 1 + rng() % (size_t{3} << 20);
    uint64_t off = rng() % (kFileBytes - len);
    if (i % 3 == 0) {
      off = k3::io::align_down(off, 4096);
      len = k3::io::align_up(len, 4096);
      if (off + len > kFileBytes) off = kFileBytes - len;
    }
    cs.push_back({off, len, i % 3 == 0 ? 0 : size_t(rng() % 4096)});
  }
  return cs;
}

// Reads every case concurrently (half batched, half from a second thread) and checks the bytes.
void read_and_compare(UringReader& reader, const File& f) {
  const auto& pat = pattern();
  auto cases = awkward_cases();
  std::vector<AlignedBuffer> bufs;
  std::vector<ReadRequest> reqs;
  for (size_t i = 0; i < cases.size(); ++i) {
    bufs.emplace_back(cases[i].length + cases[i].dst_shift + 1);
    reqs.push_back(
        {&f, cases[i].offset, bufs.back().bytes().subspan(cases[i].dst_shift, cases[i].length), i});
  }
  Sink sink;
  size_t half = reqs.size() / 2;
  std::thread other([&] {
    for (size_t i = half; i < reqs.size(); ++i) reader.submit(reqs[i], sink.callback());
  });
  reader.submit(std::span(reqs).first(half), sink.callback());
  other.join();
  REQUIRE(sink.wait_for(reqs.size(), std::chrono::seconds(60)));
  reader.wait_idle();
  for (size_t i = 0; i < reqs.size(); ++i) {
    CAPTURE(i);
    CAPTURE(cases[i].offset);
    CAPTURE(cases[i].length);
    REQUIRE(sink.calls[i] == 1);
    REQUIRE(sink.last[i].ok());
    CHECK(sink.last[i].dst.data() == reqs[i].dst.data());
    CHECK(std::memcmp(reqs[i].dst.data(), pat.bytes.data() + cases[i].offset, cases[i].length) == 0);
  }
}

size_t total_bytes(const std::vector<Case>& cs) {
  size_t n = 0;
  for (const Case& c : cs) n += c.length;
  return n;
}

// Sets an environment variable for one scope.
struct ScopedEnv {
  const char* name;
  ScopedEnv(const char* n, const char* v) : name(n) { ::setenv(n, v, 1); }
  ~ScopedEnv() { ::unsetenv(name); }
};

}  // namespace

TEST_CASE("io_uring backend reads awkward concurrent requests exactly, O_DIRECT where aligned") {
  const auto& pat = pattern();
  File f = File::open_read(pat.path, File::Mode::direct_preferred);
  if (!f.direct()) MESSAGE("filesystem refused O_DIRECT: only buffered reads are exercised");
  UringReader reader;
  if (reader.backend() != UringReader::Backend::uring)
    FAIL("io_uring unavailable on this machine: " << reader.fallback_reason());
  read_and_compare(reader, f);

  auto c = reader.counters();
  MESSAGE("requests " << c.requests << ", chunks " << c.uring_chunks << ", io_uring bytes " << c.uring_bytes
                      << ", O_DIRECT bytes " << c.direct_bytes << ", resubmissions " << c.resubmissions);
  const auto cases = awkward_cases();
  CHECK(c.requests == cases.size());
  CHECK(c.failed == 0);
  CHECK(c.uring_bytes == total_bytes(cases));  // every byte came through io_uring
  CHECK(c.pread_bytes == 0);
  CHECK(c.uring_chunks >= cases.size() - 1);  // the empty request has no chunk
  if (f.direct()) {
    CHECK(c.direct_bytes >= (size_t{20} << 20));  // the aligned multi-chunk case at least
    CHECK(c.direct_bytes < c.uring_bytes);        // unaligned pieces went buffered
  }
}

TEST_CASE("large requests are split into chunk_bytes pieces and the queue depth is respected") {
  const auto& pat = pattern();
  File f = File::open_read(pat.path, File::Mode::direct_preferred);
  UringReader reader(UringReader::Options{.chunk_bytes = 256 << 10, .queue_depth = 4});
  REQUIRE(reader.backend() == UringReader::Backend::uring);
  AlignedBuffer buf(kFileBytes);
  Sink sink;
  reader.submit({&f, 0, buf.bytes(), 7}, sink.callback());
  REQUIRE(sink.wait_for(1, std::chrono::seconds(60)));
  REQUIRE(sink.last[7].ok());
  CHECK(std::memcmp(buf.data(), pat.bytes.data(), kFileBytes) == 0);
  auto c = reader.counters();
  CHECK(c.uring_chunks == kFileBytes / (256 << 10));
  CHECK(c.uring_bytes == kFileBytes);
  CHECK(c.peak_in_flight == 4);  // 256 chunks ready at once: exactly the queue depth in the kernel
  if (f.direct()) CHECK(c.direct_bytes == kFileBytes);
}

TEST_CASE("urgent requests overtake queued non-urgent ones; each kind keeps its order") {
  // One submit() of [A, B, C urgent, D urgent] with one chunk in flight at a time: the reader must
  // issue C, D, A, B -- so they complete in that order, on both backends -- and read them exactly.
  const auto& pat = pattern();
  File f = File::open_read(pat.path, File::Mode::direct_preferred);
  for (bool pread_backend : {false, true}) {
    CAPTURE(pread_backend);
    UringReader reader(
        UringReader::Options{.chunk_bytes = 64 << 10, .queue_depth = 1, .force_pread = pread_backend});
    AlignedBuffer buf(size_t{4} << 20);
    const size_t big = size_t{1} << 20, small = size_t{64} << 10;
    std::vector<ReadRequest> reqs = {
        {&f, 0, buf.bytes().subspan(0, big), 1, false},
        {&f, big, buf.bytes().subspan(big, big), 2, false},
        {&f, 2 * big, buf.bytes().subspan(2 * big, small), 3, true},
        {&f, 3 * big, buf.bytes().subspan(3 * big, small), 4, true},
    };
    std::mutex mu;
    std::vector<uint64_t> order;
    reader.submit(reqs, [&](const ReadCompletion& c) {
      std::lock_guard lk(mu);
      order.push_back(c.ok() ? c.tag : 100 + c.tag);
    });
    reader.wait_idle();
    CHECK(order == std::vector<uint64_t>{3, 4, 1, 2});
    for (const ReadRequest& r : reqs)
      CHECK(std::memcmp(r.dst.data(), pat.bytes.data() + r.offset, r.dst.size()) == 0);
  }
}

TEST_CASE("pread fallback gives identical bytes (forced by option and by K3FLOW_NO_URING)") {
  const auto& pat = pattern();
  File f = File::open_read(pat.path, File::Mode::direct_preferred);
  SUBCASE("option") {
    UringReader reader(UringReader::Options{.force_pread = true});
    REQUIRE(reader.backend() == UringReader::Backend::pread);
    read_and_compare(reader, f);
    auto c = reader.counters();
    CHECK(c.pread_bytes == total_bytes(awkward_cases()));
    CHECK(c.uring_bytes == 0);
    CHECK(c.uring_chunks == 0);
  }
  SUBCASE("environment") {
    ScopedEnv env("K3FLOW_NO_URING", "1");
    UringReader reader;
    REQUIRE(reader.backend() == UringReader::Backend::pread);
    CHECK(reader.fallback_reason().find("K3FLOW_NO_URING") != std::string::npos);
    read_and_compare(reader, f);
    CHECK(reader.counters().pread_bytes == total_bytes(awkward_cases()));
  }
}

TEST_CASE("reads past EOF and on a truncated file complete with an error naming the file") {
  const auto& pat = pattern();
  fs::path trunc_path = fs::absolute("uring_reader_truncated.bin");
  Pattern::write_file(trunc_path, std::span(pat.bytes).first(size_t{4} << 20));
  File whole = File::open_read(pat.path, File::Mode::direct_preferred);
  File shrinking = File::open_read(trunc_path, File::Mode::direct_preferred);
  REQUIRE(::truncate(trunc_path.c_str(), 1 << 20) == 0);  // shrinks after open: size() is stale

  for (bool force_pread : {false, true}) {
    CAPTURE(force_pread);
    UringReader reader(UringReader::Options{.force_pread = force_pread});
    AlignedBuffer a(8192), b(size_t{3} << 20), ok(4096);
    Sink sink;
    auto t0 = std::chrono::steady_clock::now();
    reader.submit({&whole, kFileBytes - 4096, a.bytes(), 1}, sink.callback());    // 4 KiB past EOF
    reader.submit({&shrinking, size_t{1} << 19, b.bytes(), 2}, sink.callback());  // crosses new end
    reader.submit({&whole, 0, ok.bytes(), 3}, sink.callback());                   // unaffected
    REQUIRE(sink.wait_for(3, std::chrono::seconds(10)));
    CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(10));
    CHECK_FALSE(sink.last[1].ok());
    CHECK(sink.last[1].message.find(pat.path.string()) != std::string::npos);
    CHECK(sink.last[1].message.find('\n') == std::string::npos);
    CHECK_FALSE(sink.last[2].ok());
    CHECK(sink.last[2].message.find(trunc_path.string()) != std::string::npos);
    CHECK(sink.last[3].ok());
    CHECK(reader.counters().failed == 2);
  }
  fs::remove(trunc_path);
}

TEST_CASE("a completion callback may submit the next read (the graph re-arms from completions)") {
  const auto& pat = pattern();
  File f = File::open_read(pat.path, File::Mode::direct_preferred);
  UringReader reader;
  constexpr size_t kStep = size_t{1} << 20;
  AlignedBuffer buf(kFileBytes);
  std::atomic<int> done{0};
  std::function<void(const ReadCompletion&)> chain = [&](const ReadCompletion& c) {
    REQUIRE(c.ok());
    uint64_t next = c.tag + 1;
    if (next * kStep < kFileBytes)
      reader.submit({&f, next * kStep, buf.bytes().subspan(next * kStep, kStep), next}, chain);
    ++done;
  };
  reader.submit({&f, 0, buf.bytes().first(kStep), 0}, chain);
  for (int i = 0; i < 600 && done < int(kFileBytes / kStep); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  reader.wait_idle();
  CHECK(done == int(kFileBytes / kStep));
  CHECK(std::memcmp(buf.data(), pat.bytes.data(), kFileBytes) == 0);
}

TEST_CASE("destroying the reader with requests in flight completes each exactly once") {
  const auto& pat = pattern();
  File f = File::open_read(pat.path, File::Mode::direct_preferred);
  for (bool force_pread : {false, true}) {
    CAPTURE(force_pread);
    constexpr size_t kN = 256, kLen = size_t{1} << 20;
    AlignedBuffer buf(kN * kLen);
    Sink sink;
    {
      UringReader reader(UringReader::Options{.queue_depth = 8, .force_pread = force_pread});
      std::vector<ReadRequest> reqs;
      for (size_t i = 0; i < kN; ++i)
        reqs.push_back({&f, (i * kLen) % kFileBytes, buf.bytes().subspan(i * kLen, kLen), i});
      reader.submit(reqs, sink.callback());
      for (int i = 0; i < 10000 && sink.total == 0; ++i)
        std::this_thread::sleep_for(std::chrono::microseconds(100));
    }  // some requests done, some in the kernel, most queued: the destructor waits, cancels the rest
    REQUIRE(sink.total == kN);
    CHECK(sink.total > 0);
    size_t ok = 0;
    for (size_t i = 0; i < kN; ++i) {
      REQUIRE(sink.calls[i] == 1);
      if (sink.last[i].ok()) {
        ++ok;
        CHECK(std::memcmp(buf.data() + i * kLen, pat.bytes.data() + (i * kLen) % kFileBytes, kLen) == 0);
      } else {
        CHECK(sink.last[i].error == ECANCELED);
      }
    }
    MESSAGE("completed before shutdown: " << ok << " of " << kN);
  }
}

TEST_CASE("sort_by_position orders a batch by file, then offset; equal positions keep their order") {
  // Two File objects in one vector, as a ShardSet holds its shards: their addresses order the batch.
  std::vector<File> files;
  files.push_back(File::open_read(pattern().path, File::Mode::buffered));
  files.push_back(File::open_read(pattern().path, File::Mode::buffered));
  const File* a = &files[0];
  const File* b = &files[1];
  std::vector<ReadRequest> batch = {{b, 4096, {}, 0}, {a, 8192, {}, 1, true}, {b, 0, {}, 2},
                                    {a, 8192, {}, 3}, {a, 0, {}, 4},          {b, 4096, {}, 5}};
  k3::io::sort_by_position(batch);
  std::vector<uint64_t> tags;
  for (const ReadRequest& r : batch) tags.push_back(r.tag);
  CHECK(tags == std::vector<uint64_t>{4, 1, 3, 2, 0, 5});
  CHECK(batch[1].urgent);  // only the order changes
}

TEST_CASE("ring memory estimate grows with queue depth") {
  CHECK(UringReader::ring_bytes(32) >= 4096);
  CHECK(UringReader::ring_bytes(1024) > UringReader::ring_bytes(32));
}

// ---- adaptation: the depth controller against a model of a device, and the urgent gate ----

namespace {

// A device that serves `depth` chunks of `chunk` bytes concurrently, each taking `latency_s`, up to
// `ceiling` bytes/s (Little's law): rate = min(depth * chunk / latency, ceiling).
struct ModelDevice {
  double latency_s, ceiling;
  double rate(unsigned depth, double chunk) const { return std::min(depth * chunk / latency_s, ceiling); }
};

// Runs the tuner for `epochs` saturated epochs of 64 MiB against the device; returns the depths taken.
std::vector<unsigned> drive(k3::io::DepthTuner& t, const ModelDevice& dev, int epochs,
                            double chunk = 1 << 20) {
  std::vector<unsigned> seen;
  for (int i = 0; i < epochs; ++i) {
    const double bytes = 64.0 * (1 << 20);
    t.on_epoch(uint64_t(bytes), bytes / dev.rate(t.depth(), chunk));
    seen.push_back(t.depth());
  }
  return seen;
}

}  // namespace

TEST_CASE("depth tuner: deeper on a fast device, the start depth on a slow one, the knee not past it") {
  using k3::io::DepthTuner;
  const DepthTuner::Config cfg{.start_depth = 4, .min_depth = 4, .max_depth = 64};
  // A 14 GB/s NVMe with 1 ms per 1 MiB request: 4 x 1 MiB reads 4.2 GB/s; the knee is at 14 chunks.
  DepthTuner fast(cfg);
  drive(fast, {1e-3, 14e9}, 10);
  CHECK(fast.settled());
  CHECK(fast.depth() == 16);  // 8 -> 16 gained, 32 did not: the smallest depth at the ceiling
  CHECK(fast.best_gbps() == doctest::Approx(14.0));
  // A slow virtual disk (0.5 GB/s, 2 ms): depth buys nothing; the tuner stays at the start.
  DepthTuner slow(cfg);
  drive(slow, {2e-3, 0.5e9}, 10);
  CHECK(slow.settled());
  CHECK(slow.depth() == 4);
  // A 2.5 GB/s disk with 1.5 ms per MiB: knee at 3.9 chunks, so 4 -> 8 gains < 5 %: stays at 4.
  DepthTuner mid(cfg);
  drive(mid, {1.5e-3, 2.5e9}, 10);
  CHECK(mid.depth() == 4);
  // Capped at max_depth even when the device would take more.
  DepthTuner capped({.start_depth = 4, .min_depth = 4, .max_depth = 8});
  drive(capped, {1e-3, 100e9}, 10);
  CHECK(capped.depth() == 8);
}

TEST_CASE("depth tuner: re-checks when the device changes under it") {
  using k3::io::DepthTuner;
  DepthTuner t({.start_depth = 4, .min_depth = 4, .max_depth = 64, .gain = 1.05, .recheck_epochs = 8});
  drive(t, {1e-3, 14e9}, 10);
  REQUIRE(t.depth() == 16);
  // The device slows to 2 GB/s (another tenant): the rate halves, the tuner re-measures from half its
  // depth (16 -> 8, then at the next re-check 8 -> 4) and settles at the start depth, where 2 GB/s
  // is already reached.
  drive(t, {1e-3, 2e9}, 20);
  CHECK(t.settled());
  CHECK(t.depth() == 4);
  // It speeds up again: the periodic re-check climbs back to the knee.
  drive(t, {1e-3, 14e9}, 40);
  CHECK(t.depth() == 16);
  // Epochs without bytes or time change nothing.
  t.on_epoch(0, 1.0);
  t.on_epoch(1 << 20, 0.0);
  CHECK(t.depth() == 16);
}

TEST_CASE("an adaptive reader tunes only between its start and its cap, and reads exactly") {
  const auto& pat = pattern();
  File f = File::open_read(pat.path, File::Mode::direct_preferred);
  UringReader reader(UringReader::Options{
      .chunk_bytes = 64 << 10, .queue_depth = 2, .max_depth = 16, .epoch_bytes = 1 << 20});
  REQUIRE(reader.backend() == UringReader::Backend::uring);
  AlignedBuffer buf(kFileBytes);
  Sink sink;
  reader.submit({&f, 0, buf.bytes(), 1}, sink.callback());  // 1024 chunks: saturated throughout
  REQUIRE(sink.wait_for(1, std::chrono::seconds(60)));
  REQUIRE(sink.last[1].ok());
  CHECK(std::memcmp(buf.data(), pat.bytes.data(), kFileBytes) == 0);
  const auto c = reader.counters();
  CHECK(c.epochs >= 4);  // 64 MiB in epochs of 8 chunks x depth (1..8 MiB): it measured
  CHECK(c.depth >= 2);
  CHECK(c.depth <= 16);
  CHECK(c.peak_in_flight <= 16);
  MESSAGE("adaptive reader settled at depth " << c.depth << " after " << c.epochs << " epochs");
  // A fixed reader (no max_depth) never measures.
  UringReader fixed(UringReader::Options{.chunk_bytes = 64 << 10, .queue_depth = 2});
  fixed.submit({&f, 0, buf.bytes().first(size_t{8} << 20), 2}, sink.callback());
  fixed.wait_idle();
  CHECK(fixed.counters().epochs == 0);
  CHECK(fixed.counters().depth == 2);
}

TEST_CASE("urgent reads raise the gate; a reader sharing it holds its depth while it is up") {
  const auto& pat = pattern();
  File f = File::open_read(pat.path, File::Mode::direct_preferred);
  auto gate = std::make_shared<k3::io::UrgentGate>();
  // The expert-like reader: its urgent reads raise the gate until their callback has returned.
  UringReader experts(
      UringReader::Options{.chunk_bytes = 64 << 10, .queue_depth = 2, .gate = gate, .raises_gate = true});
  AlignedBuffer small(size_t{1} << 20);
  std::atomic<int> raised_in_callback{-1};
  experts.submit({&f, 0, small.bytes(), 1, /*urgent=*/true},
                 [&](const ReadCompletion& c) { raised_in_callback = c.ok() && gate->raised() ? 1 : 0; });
  experts.wait_idle();
  CHECK(raised_in_callback == 1);
  CHECK_FALSE(gate->raised());
  experts.submit({&f, 0, small.bytes(), 2, /*urgent=*/false}, [&](const ReadCompletion&) {
    raised_in_callback = gate->raised() ? 1 : 0;  // a prefetch does not raise it
  });
  experts.wait_idle();
  CHECK(raised_in_callback == 0);

  // The trunk-like reader: depth 16, 2 while the gate is up. With the gate held up for the whole
  // read, no more than 2 chunks were ever in the kernel, and every turn was gated.
  AlignedBuffer buf(size_t{16} << 20);
  {
    UringReader trunk(
        UringReader::Options{.chunk_bytes = 64 << 10, .queue_depth = 16, .gate = gate, .gated_depth = 2});
    REQUIRE(trunk.backend() == UringReader::Backend::uring);
    gate->raise();
    Sink sink;
    trunk.submit({&f, 0, buf.bytes(), 3}, sink.callback());
    REQUIRE(sink.wait_for(1, std::chrono::seconds(60)));
    gate->lower();
    CHECK(sink.last[3].ok());
    CHECK(std::memcmp(buf.data(), pat.bytes.data(), buf.size()) == 0);
    CHECK(trunk.counters().peak_in_flight == 2);
    CHECK(trunk.counters().gated_turns > 0);
    // Gate down: the full depth again.
    trunk.submit({&f, 0, buf.bytes(), 4}, sink.callback());
    REQUIRE(sink.wait_for(2, std::chrono::seconds(60)));
    CHECK(trunk.counters().peak_in_flight == 16);
  }
}

TEST_CASE("an urgent read is not starved by an adaptive trunk reader that is saturated") {
  // The graph's pair of readers: a trunk reader adapting its depth over a long read, and an expert
  // reader whose demand read raises the gate. The demand read, submitted after the trunk read is in
  // flight, completes first (the trunk request is 64 MiB; the expert 256 KiB).
  const auto& pat = pattern();
  File f = File::open_read(pat.path, File::Mode::direct_preferred);
  auto gate = std::make_shared<k3::io::UrgentGate>();
  UringReader trunk(UringReader::Options{.chunk_bytes = 256 << 10,
                                         .queue_depth = 4,
                                         .max_depth = 64,
                                         .epoch_bytes = 1 << 20,
                                         .gate = gate,
                                         .gated_depth = 1});
  UringReader experts(
      UringReader::Options{.chunk_bytes = 64 << 10, .queue_depth = 4, .gate = gate, .raises_gate = true});
  REQUIRE(trunk.backend() == UringReader::Backend::uring);
  AlignedBuffer big(kFileBytes), small(size_t{256} << 10);
  std::mutex mu;
  std::vector<uint64_t> order;
  auto note = [&](const ReadCompletion& c) {
    std::lock_guard lk(mu);
    order.push_back(c.ok() ? c.tag : 100 + c.tag);
  };
  trunk.submit({&f, 0, big.bytes(), 1}, note);
  experts.submit({&f, kFileBytes - small.size(), small.bytes(), 2, /*urgent=*/true}, note);
  experts.wait_idle();
  trunk.wait_idle();
  CHECK(order == std::vector<uint64_t>{2, 1});
  CHECK_FALSE(gate->raised());
  CHECK(std::memcmp(big.data(), pat.bytes.data(), kFileBytes) == 0);
  CHECK(std::memcmp(small.data(), pat.bytes.data() + kFileBytes - small.size(), small.size()) == 0);
  CHECK(trunk.counters().peak_in_flight <= 64);
}
