// Writing a planned checkpoint: generation in parallel, big sequential writes in order, commit at
// the end, and removal of everything this run created if anything fails.
#include <fcntl.h>
#include <fmt/format.h>
#include <sys/statvfs.h>
#include <tbb/concurrent_queue.h>
#include <tbb/info.h>
#include <tbb/parallel_pipeline.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <set>

#include "io/aligned.hpp"
#include "io/env.hpp"
#include "io/error.hpp"
#include "io/synth/synth.hpp"

namespace k3::io::synth {

namespace fs = std::filesystem;

namespace {

constexpr size_t kBlock = size_t{8} << 20;  // bytes generated as one unit of work and one write()

bool is_checkpoint_file(const std::string& n) {
  auto ends = [&](std::string_view s) {
    return n.size() >= s.size() && n.compare(n.size() - s.size(), s.size(), s) == 0;
  };
  for (const char* f :
       {"config.json", "model.safetensors.index.json", "tiktoken.model", "tokenizer_config.json"})
    if (n == f || n == std::string(f) + ".partial") return true;
  return (n.rfind("model-", 0) == 0 && (ends(".safetensors") || ends(".safetensors.partial")));
}

// Everything this run created; removed again unless the run is marked done.
struct Rollback {
  std::vector<fs::path> files;
  std::vector<fs::path> dirs;  // outermost first
  bool done = false;
  ~Rollback() {
    if (done) return;
    std::error_code ec;
    for (const fs::path& f : files) fs::remove(f, ec);
    for (auto it = dirs.rbegin(); it != dirs.rend(); ++it) fs::remove(*it, ec);
  }
};

void prepare_out_dir(const fs::path& out, Rollback& rb) {
  std::error_code ec;
  std::vector<fs::path> missing;
  for (fs::path p = fs::absolute(out, ec); !p.empty(); p = p.parent_path()) {
    if (fs::exists(p, ec)) break;
    missing.push_back(p);
    if (p == p.parent_path()) break;
  }
  for (auto it = missing.rbegin(); it != missing.rend(); ++it) {
    if (!fs::create_directory(*it, ec) && ec)
      throw io::runtime_error(
          fmt::format("cannot create output directory {}: {}", out.string(), ec.message()));
    rb.dirs.push_back(*it);
  }
  if (!fs::is_directory(out, ec))
    throw io::runtime_error(fmt::format("output directory {} is not a directory", out.string()));
  if (::access(out.c_str(), W_OK | X_OK) != 0)
    throw io::runtime_error(
        fmt::format("output directory {} is not writable: {}", out.string(), std::strerror(errno)));
}

std::vector<fs::path> existing_checkpoint_files(const fs::path& out) {
  std::vector<fs::path> found;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(out, ec))
    if (is_checkpoint_file(e.path().filename().string())) found.push_back(e.path());
  std::sort(found.begin(), found.end());
  return found;
}

// "20.48 MiB": k3flow's one convention for sizes (binary units, two decimals; what
// pipeline/support/human_bytes.hpp prints, which k3_synth may not include: it sits below pipeline/).
std::string binary_units(uint64_t bytes) {
  const char* unit[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  double v = double(bytes);
  int i = 0;
  while (v >= 1024.0 && i < 5) {
    v /= 1024.0;
    ++i;
  }
  return i == 0 ? fmt::format("{} B", bytes) : fmt::format("{:.2f} {}", v, unit[i]);
}

void check_free_space(const fs::path& out, uint64_t need) {
  struct statvfs st {};
  if (::statvfs(out.c_str(), &st) != 0) return;
  const uint64_t avail = uint64_t(st.f_bavail) * st.f_frsize;
  if (need > avail) throw io::runtime_error(free_space_refusal(out, avail, need));
}

void write_text_file(const fs::path& path, const std::string& text, Rollback& rb) {
  const fs::path tmp = io::partial_path(path);
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0)
    throw io::runtime_error(fmt::format("cannot create {}: {}", tmp.string(), std::strerror(errno)));
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      throw io::runtime_error(fmt::format("cannot write {}: {}", tmp.string(), std::strerror(err)));
    }
    done += static_cast<size_t>(n);
  }
  if (::fdatasync(fd) != 0 || ::close(fd) != 0 || ::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    throw io::runtime_error(fmt::format("cannot write {}: {}", path.string(), std::strerror(err)));
  }
  rb.files.push_back(path);
}

void sync_dir(const fs::path& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  ::fsync(fd);
  ::close(fd);
}

uint64_t forced_failure_after() {
  return io::env::u64(io::env::kSynthFailAfter).value_or(UINT64_MAX);
}

std::vector<io::TensorEntry> entries_of(const SynthShard& s) {
  std::vector<io::TensorEntry> v;
  v.reserve(s.tensors.size());
  for (const SynthTensor& t : s.tensors) v.push_back(t.entry);
  return v;
}

// One block of a shard's data region: generated as a unit, written with one append.
struct Block {
  int shard = 0;
  uint64_t offset = 0, size = 0;  // within the shard's data
  bool first = false, last = false;
  std::byte* buf = nullptr;
};

// Walks the shards' data regions in file order, handing out blocks whose ends fall on multiples of
// kBlock in FILE offsets: after a shard's first block every write is aligned, so the writer sends
// the pipeline's (aligned) buffers straight to the disk with O_DIRECT.
class BlockCursor {
 public:
  BlockCursor(const SynthCheckpoint& plan, const std::vector<io::ShardLayout>& layouts)
      : plan_(plan), layouts_(layouts) {}
  bool next(Block& b) {
    if (shard_ >= static_cast<int>(plan_.shards.size())) return false;
    const uint64_t total = layouts_[shard_].data_bytes, start = layouts_[shard_].data_start();
    const uint64_t boundary = (start + offset_) / kBlock * kBlock + kBlock;
    b.shard = shard_;
    b.offset = offset_;
    b.size = std::min<uint64_t>(boundary - (start + offset_), total - offset_);
    b.first = offset_ == 0;
    offset_ += b.size;
    b.last = offset_ >= total;
    if (b.last) ++shard_, offset_ = 0;
    return true;
  }

 private:
  const SynthCheckpoint& plan_;
  const std::vector<io::ShardLayout>& layouts_;
  int shard_ = 0;
  uint64_t offset_ = 0;
};

// Tensor data offsets of every shard, so a block finds the tensors it overlaps.
struct ShardOffsets {
  std::vector<std::vector<uint64_t>> begin;
  explicit ShardOffsets(const SynthCheckpoint& plan) {
    for (const SynthShard& s : plan.shards) {
      auto& v = begin.emplace_back();
      uint64_t off = 0;
      for (const SynthTensor& t : s.tensors) v.push_back(std::exchange(off, off + t.entry.nbytes()));
    }
  }
};

void generate(const SynthCheckpoint& plan, const ShardOffsets& offs, uint64_t seed, const Block& b) {
  const auto& tensors = plan.shards[b.shard].tensors;
  const auto& begin = offs.begin[b.shard];
  const uint64_t end = b.offset + b.size;
  size_t i = std::upper_bound(begin.begin(), begin.end(), b.offset) - begin.begin();
  i = i ? i - 1 : 0;
  for (; i < tensors.size() && begin[i] < end; ++i) {
    const uint64_t t_end = begin[i] + tensors[i].entry.nbytes();
    const uint64_t from = std::max(b.offset, begin[i]), to = std::min(end, t_end);
    if (from >= to) continue;
    fill_bytes(tensors[i], seed, from - begin[i], {b.buf + (from - b.offset), to - from});
  }
}

}  // namespace

std::string free_space_refusal(const fs::path& out_dir, uint64_t avail, uint64_t need) {
  return fmt::format("output directory {} has {} bytes free ({}), the checkpoint needs {} bytes ({})",
                     out_dir.string(), avail, binary_units(avail), need, binary_units(need));
}

SynthReport write_checkpoint(const SynthCheckpoint& plan, const fs::path& out_dir,
                             const SynthOptions& options) {
  const auto t0 = std::chrono::steady_clock::now();
  Rollback rb;
  prepare_out_dir(out_dir, rb);
  // Leftover .partial files (a killed run) never look like a checkpoint: they are simply removed.
  // Finished files are only replaced when asked to.
  std::vector<fs::path> stale;
  std::error_code ec;
  for (const fs::path& p : existing_checkpoint_files(out_dir)) {
    if (p.extension() == ".partial")
      fs::remove(p, ec);
    else
      stale.push_back(p);
  }
  if (!stale.empty() && !options.overwrite)
    throw io::runtime_error(
        fmt::format("output directory {} already holds checkpoint files ({}); pass --force to "
                    "replace them or choose another directory",
                    out_dir.string(), stale.front().filename().string()));

  uint64_t logical = 0, header_bytes = 0;
  std::vector<io::ShardLayout> layouts;
  for (const SynthShard& s : plan.shards) {
    layouts.push_back(io::layout_shard(entries_of(s), {}));
    logical += layouts.back().file_size();
    header_bytes += layouts.back().data_start();
  }
  const std::string index = index_json(plan);
  const std::string config = plan.config_text.empty() ? config_json(plan.config) : plan.config_text;
  check_free_space(out_dir, (plan.sparse ? header_bytes : logical) + index.size() + config.size() +
                                plan.tiktoken_model.size() + plan.tokenizer_config.size() + (16 << 20));

  SynthReport report;
  report.shards = plan.shards.size();
  report.tensors = plan.tensor_count();
  report.logical_bytes = logical;
  const uint64_t fail_after = forced_failure_after();
  auto check_stop = [&](uint64_t done) {
    if (options.cancelled && options.cancelled())
      throw io::runtime_error(fmt::format("interrupted; removed the partial output in {}", out_dir.string()));
    if (done >= fail_after) throw io::runtime_error("forced failure (K3_SYNTH_FAIL_AFTER)");
  };
  std::vector<std::optional<io::SafetensorsWriter>> writers(plan.shards.size());
  auto shard_path = [&](size_t s) { return out_dir / plan.shards[s].file; };

  if (plan.sparse) {
    uint64_t done = 0;
    for (size_t s = 0; s < plan.shards.size(); ++s) {
      writers[s].emplace(shard_path(s), entries_of(plan.shards[s]), io::Metadata{});
      writers[s]->finish_sparse();
      done += writers[s]->layout().file_size();
      if (options.progress) options.progress(done, logical);
      check_stop(done);
    }
  } else {
    const ShardOffsets offs(plan);
    const uint64_t total = plan.data_bytes();
    const size_t tokens = std::max<size_t>(4, 2 * static_cast<size_t>(tbb::info::default_concurrency()));
    std::vector<io::AlignedBuffer> buffers;
    tbb::concurrent_queue<std::byte*> free_buffers;
    for (size_t i = 0; i < tokens; ++i)
      free_buffers.push(buffers.emplace_back(kBlock, io::kDirectAlign).data());
    BlockCursor cursor(plan, layouts);
    uint64_t written = 0;

    tbb::parallel_pipeline(
        tokens, tbb::make_filter<void, Block>(tbb::filter_mode::serial_in_order, [&](tbb::flow_control& fc) {
                  Block b;
                  if (!cursor.next(b)) {
                    fc.stop();
                    return b;
                  }
                  // As many buffers as tokens: one is always free here.
                  if (!free_buffers.try_pop(b.buf)) throw std::logic_error("synth: no free buffer");
                  return b;
                }) & tbb::make_filter<Block, Block>(tbb::filter_mode::parallel, [&](Block b) {
                  generate(plan, offs, options.seed, b);
                  return b;
                }) & tbb::make_filter<Block, void>(tbb::filter_mode::serial_in_order, [&](Block b) {
                  auto& w = writers[b.shard];
                  if (b.first)
                    w.emplace(shard_path(b.shard), entries_of(plan.shards[b.shard]), io::Metadata{});
                  w->append({b.buf, b.size});
                  free_buffers.push(b.buf);
                  written += b.size;
                  check_stop(written);
                  if (b.last) w->finish();
                  if (options.progress) options.progress(written, total);
                }));
    report.data_written = written;
  }

  check_stop(0);
  // Every shard is complete: only now do the final names appear, then the config and index.
  for (size_t s = 0; s < writers.size(); ++s) {
    writers[s]->commit();
    rb.files.push_back(shard_path(s));
  }
  write_text_file(out_dir / "model.safetensors.index.json", index, rb);
  if (!plan.tiktoken_model.empty()) {
    write_text_file(out_dir / "tiktoken.model", plan.tiktoken_model, rb);
    write_text_file(out_dir / "tokenizer_config.json", plan.tokenizer_config, rb);
  }
  write_text_file(out_dir / "config.json", config, rb);
  std::set<fs::path> ours(rb.files.begin(), rb.files.end());
  for (const fs::path& p : stale)
    if (!ours.count(p)) fs::remove(p, ec);
  sync_dir(out_dir);
  rb.done = true;
  report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return report;
}

}  // namespace k3::io::synth
