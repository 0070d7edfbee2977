#include "pipeline/serve/rank_steps.hpp"

#include <fmt/format.h>

#include <cstring>
#include <span>

#include "io/error.hpp"

namespace k3::pipeline::serve {

namespace {

// Rank 0's side of the broadcast: what a timeout or an MPI failure names.
constexpr const char* kSendWhat = "step order to the other ranks";

struct Reader {
  std::span<const int32_t> w;
  size_t at = 0;
  int32_t next(const char* field) {
    if (at >= w.size())
      throw io::runtime_error(
          fmt::format("step order from rank 0: ends before its {} (internal error)", field));
    return w[at++];
  }
  size_t count(const char* field, size_t most) {
    const int32_t n = next(field);
    if (n < 0 || size_t(n) > most)
      throw io::runtime_error(
          fmt::format("step order from rank 0: {} {} outside 0..{} (internal error)", field, n, most));
    return size_t(n);
  }
};

}  // namespace

std::string encode_step(const StepOrder& o) {
  std::vector<int32_t> w;
  w.push_back(o.stop ? 1 : 0);
  w.push_back(int32_t(o.resets.size()));
  w.insert(w.end(), o.resets.begin(), o.resets.end());
  w.push_back(int32_t(o.rows.size()));
  for (const StepOrder::Row& r : o.rows) {
    w.push_back(r.seq);
    w.push_back(int32_t(r.ids.size()));
    w.insert(w.end(), r.ids.begin(), r.ids.end());
  }
  std::string bytes(w.size() * sizeof(int32_t), '\0');
  std::memcpy(bytes.data(), w.data(), bytes.size());
  return bytes;
}

StepOrder decode_step(std::string_view bytes) {
  if (bytes.size() % sizeof(int32_t) != 0)
    throw io::runtime_error(
        fmt::format("step order from rank 0: {} bytes, not whole words (internal error)", bytes.size()));
  std::vector<int32_t> w(bytes.size() / sizeof(int32_t));
  std::memcpy(w.data(), bytes.data(), bytes.size());
  Reader r{.w = w};
  StepOrder o;
  o.stop = r.next("stop flag") != 0;
  o.resets.resize(r.count("reset count", w.size()));
  for (int& s : o.resets) s = r.next("reset slot");
  o.rows.resize(r.count("row count", w.size()));
  for (StepOrder::Row& row : o.rows) {
    row.seq = r.next("row slot");
    row.ids.resize(r.count("row id count", w.size()));
    for (int32_t& id : row.ids) id = r.next("row id");
  }
  if (r.at != w.size())
    throw io::runtime_error(
        fmt::format("step order from rank 0: {} words after its last row (internal error)", w.size() - r.at));
  return o;
}

void send_step(ranks::Comm& comm, const StepOrder& o) {
  ranks::from_rank0(comm, encode_step(o), kSendWhat);
}

StepOrder receive_step(ranks::Comm& comm) {
  return decode_step(ranks::from_rank0(comm, std::string(), ranks::kRank0Server));
}

void follow_steps(ranks::Comm& comm, BatchEngine& engine) {
  const size_t vocab = size_t(engine.config().vocab);
  std::vector<std::vector<float>> logits(size_t(engine.max_seqs()), std::vector<float>(vocab));
  std::vector<BatchEngine::Row> rows;
  for (;;) {
    const StepOrder o = receive_step(comm);
    if (o.stop) return;
    for (int s : o.resets) engine.reset(s);
    if (o.rows.empty()) continue;
    rows.clear();
    for (const StepOrder::Row& r : o.rows) {
      if (r.seq < 0 || r.seq >= engine.max_seqs())
        throw io::runtime_error(fmt::format("step order from rank 0: slot {} outside 0..{} (internal error)",
                                            r.seq, engine.max_seqs() - 1));
      rows.push_back(BatchEngine::Row{.seq = r.seq, .ids = r.ids, .logits = logits[size_t(r.seq)]});
    }
    try {
      engine.step(rows);
    } catch (const io::Error& e) {
      if (e.kind() != io::ErrorKind::run_invalid) throw;
    }
  }
}

}  // namespace k3::pipeline::serve
