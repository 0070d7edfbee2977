// `mpirun -np N k3flow generate` (docs/distributed.md) on this machine, N ranks over loopback: the
// generated ids and the dumped logits are the single process's bytes at N = 1, 2, 4 on the tiny
// oracle model and at N = 2 and 4 on a synthetic bf16 + MXFP4 checkpoint, resident, and with per-rank
// streaming (each rank within its own budget, docs/distributed.md §6) at N = 3 and 2 (every step at
// N = 1..4, several budgets and strategies: test_dist); chat's conversation is the single process's;
// and the faults end the run on every rank with one clear error, never a hang: a rank whose shard
// or packed trunk is truncated, a rank killed, a rank that stops answering. `serve` under mpirun:
// rank 0 answers HTTP on loopback, two concurrent requests (one joining while the other decodes) get
// generate's ids at N = 2 resident and N = 3 streamed per rank; SIGTERM to rank 0 drains and every
// rank exits 0; a follower that cannot load its slice, or dies in a step, ends the run with one
// error naming it. Skipped, saying why, when the build has no MPI or mpirun is missing.
#include <doctest/doctest.h>
#include <fmt/format.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/fixture_json.hpp"
#include "tests/run_helpers.hpp"
#include "tests/test_serve_client.hpp"

using namespace k3;
namespace fs = std::filesystem;

namespace {

#ifdef K3_MPIEXEC
const char* const kMpiexec = K3_MPIEXEC;
#else
const char* const kMpiexec = nullptr;
#endif

bool have_mpi() {
  if (!kMpiexec) {
    MESSAGE(
        "skipped: this build has no MPI (CMake did not find it, or a sanitizer build): docs/distributed.md");
    return false;
  }
  if (::access(kMpiexec, X_OK) != 0) {
    MESSAGE("skipped: " << kMpiexec << " is not executable (apt-get install openmpi-bin)");
    return false;
  }
  return true;
}

// mpirun as root needs both variables; oversubscribe: more ranks than this machine's cores. The
// shared-memory transport copies through a buffer instead of cross-memory attach (CMA), which
// containers often forbid (ptrace scope): the ranks all run on this one host.
std::string mpirun(const std::string& ranks_and_env) {
  return fmt::format(
      "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 "
      "OMPI_MCA_btl_vader_single_copy_mechanism=none "
      "{} --oversubscribe {}",
      kMpiexec, ranks_and_env);
}

std::string line_with(const std::string& text, const std::string& prefix) {
  const size_t at = text.find(prefix);
  return at == std::string::npos ? std::string() : text.substr(at, text.find('\n', at) - at);
}

// What mpirun() passes in its command line, for test::ServeChild (the launcher and its environment).
const char* const kMpiEnv =
    "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl_vader_single_copy_mechanism=none";
std::vector<std::string> mpirun_argv(int ranks, const std::vector<std::string>& flags = {}) {
  std::vector<std::string> v = {kMpiexec, "--oversubscribe"};
  v.insert(v.end(), flags.begin(), flags.end());
  v.insert(v.end(), {"-np", std::to_string(ranks)});
  return v;
}

int count(const std::string& text, const std::string& what) {
  int n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// The single process, then N ranks (run with `ranks_flags` besides: e.g. a per-rank budget): the same
// generated ids and the same step-0 logits bytes. Returns the last run's stdout.
std::string check_same_as_one_process(const std::string& model, const std::string& ids,
                                      std::initializer_list<int> ns, const std::string& ranks_flags = "") {
  test::TempDir dir;
  const std::string args = fmt::format("generate {} --ids {} --gen 6 --no-progress", model, ids);
  const test::Run one = test::k3flow(args + " --dump-logits " + (dir / "one.bin"));
  REQUIRE_MESSAGE(one.code == 0, one.err);
  const std::string want = line_with(one.out, "generated ids:");
  REQUIRE(!want.empty());
  std::string out;
  for (int n : ns) {
    CAPTURE(n);
    CAPTURE(ranks_flags);
    const std::string dump = dir / fmt::format("n{}.bin", n);
    const test::Run r = test::shell(
        mpirun(fmt::format("-np {} {} {} {} --dump-logits {}", n, K3FLOW_BIN, args, ranks_flags, dump)), 60);
    REQUIRE_MESSAGE(r.code == 0, r.err);
    CHECK(line_with(r.out, "generated ids:") == want);
    CHECK(count(r.out, "generated ids:") == 1);  // rank 0 alone prints
    CHECK(test::slurp(dump) == test::slurp(dir / "one.bin"));
    out = r.out;
  }
  return out;
}

struct Synth {
  test::TempDir dir;
  std::string model;
  Synth() : model(dir / "m") {
    const test::Run s =
        test::k3flow(fmt::format("synth {} --size tiny --layers 6 --shards 2 --seed 11", model));
    REQUIRE_MESSAGE(s.code == 0, s.err);
  }
};

Synth& synth() {  // one checkpoint for every case and subcase
  static Synth s;
  return s;
}

// A job whose rank 1 cannot load its slice (a shard cut short: `cut`) ends with exit 1 and one line.
// A copy of `model` in `bad` (a directory of symlinks) whose first file `pick` accepts is a real
// copy cut to half its size; returns that file's path (empty when `pick` accepted none).
std::string with_truncated_file(const fs::path& model, const fs::path& bad,
                                const std::function<bool(const fs::path&)>& pick) {
  fs::create_directory(bad);
  std::string cut;
  for (const fs::directory_entry& e : fs::directory_iterator(model)) {
    const fs::path to = bad / e.path().filename();
    if (cut.empty() && pick(e.path())) {
      cut = to.string();
      fs::copy_file(e.path(), to);
      fs::resize_file(to, fs::file_size(to) / 2);
    } else {
      fs::create_symlink(e.path(), to);
    }
  }
  return cut;
}

void check_slice_refused(const test::Run& r, const std::string& cut) {
  CHECK_FALSE(r.timed_out);
  CHECK(r.code == 1);
  CHECK(count(r.err, "k3flow: ") == 1);
  const std::string line = line_with(r.err, "k3flow: ");
  CHECK(line.find("rank 1 of 2 could not load its slice") != std::string::npos);
  CHECK(line.find(fs::path(cut).filename().string()) != std::string::npos);
}

}  // namespace

TEST_CASE("mpirun -np 1, 2, 4 on the tiny oracle model: the single process's ids and logits bytes") {
  if (!have_mpi()) return;
  // N = 3: streamed per rank below; every N of 1..4 every step: test_dist
  check_same_as_one_process(test::fixture_path("tiny-k3"), "1,17,200,3,42", {1, 2, 4});
}

TEST_CASE(
    "mpirun -np 2, 4 on a synthetic bf16 + MXFP4 checkpoint: the single process's ids and logits bytes") {
  if (!have_mpi()) return;
  check_same_as_one_process(synth().model, "3,1,4,1,5,9", {2, 4});  // and 3: test_dist, every step
}

TEST_CASE("mpirun with per-rank streaming: each rank streams its slice, the single process's bytes") {
  if (!have_mpi()) return;
  const std::string tiny = test::fixture_path("tiny-k3");
  // (every N of 1..4 and more budgets and strategies: test_dist, ranks as threads; mpirun's start is
  // most of a case's time here)
  SUBCASE("tiny model at each rank's floor, N = 3") {
    const std::string out = check_same_as_one_process(tiny, "1,17,200,3,42", {3}, "--preset ultra");
    CHECK(out.find("expert parallel: this rank streams the trunk and its 3 of 8 routed experts") !=
          std::string::npos);  // rank 0 of 3 owns experts 0, 3, 6
    CHECK(out.find("expert exchange: send + receive (1 of 3 ranks)") != std::string::npos);
  }
  SUBCASE("tiny model at the floor under the trunk strategy, with the trace and the DOT dump, N = 2") {
    test::TempDir dir;
    const std::string trace = dir / "t.json", dot = dir / "g.dot";
    check_same_as_one_process(
        tiny, "1,17,200,3,42", {2},
        fmt::format("--preset ultra --strategy trunk --trace {} --graph-dot {}", trace, dot));
    const std::string t = test::slurp(trace), d = test::slurp(dot);
    CHECK(t.find("\"name\":\"expert_exchange\"") != std::string::npos);
    CHECK(t.find("\"cat\":\"comm\"") != std::string::npos);
    CHECK(d.find("\"expert_exchange\" -> \"combine\"") != std::string::npos);
  }
  SUBCASE("synthetic bf16 + MXFP4 from a packed trunk, a budget between floor and everything, N = 2") {
    Synth& s = synth();
    const std::string packed = s.dir / "packed";
    if (!fs::exists(packed)) {
      const test::Run p = test::k3flow(fmt::format("pack-trunk {} {}", s.model, packed));
      REQUIRE_MESSAGE(p.code == 0, p.err);
    }
    check_same_as_one_process(s.model, "3,1,4,1,5,9", {2}, fmt::format("--trunk {} --mem-gb 0.021", packed));
  }
}

TEST_CASE("mpirun chat: rank 0 reads the lines and alone prints, the single process's conversation") {
  if (!have_mpi()) return;
  const std::string tiny = test::fixture_path("tiny-k3");
  const std::string input = "printf 'What is a pipeline?\\nAnd a graph?\\n' | ";
  const std::string args =
      fmt::format("chat {} --no-thinking --max-reply 10 --context 512 --no-progress", tiny);
  const test::Run one = test::shell(fmt::format("{}{} {}", input, K3FLOW_BIN, args), 60);
  REQUIRE_MESSAGE(one.code == 0, one.err);
  REQUIRE(one.out.size() > 2);
  // each rank streaming its slice at its floor (resident ranks take the same path, with another model)
  const test::Run r =
      test::shell(input + mpirun(fmt::format("-np 2 {} {} --preset ultra", K3FLOW_BIN, args)), 60);
  REQUIRE_MESSAGE(r.code == 0, r.err);
  CHECK(r.out == one.out);
  CHECK(count(r.err, " prompt ids)") == 2);  // two replies, summarized by rank 0 alone
}

TEST_CASE(
    "mpirun: rank 0 reads the prompt file (the other rank's path does not exist) and alone prints the text") {
  if (!have_mpi()) return;
  test::TempDir dir;
  const std::string prompt = dir / "prompt.txt";
  { std::ofstream(prompt) << "Write a haiku about disks."; }
  const std::string tiny = test::fixture_path("tiny-k3");
  const std::string args = fmt::format("generate {} --gen 8 --no-progress --prompt-file", tiny);
  const test::Run one = test::k3flow(args + " " + prompt);
  REQUIRE_MESSAGE(one.code == 0, one.err);
  REQUIRE(!one.out.empty());
  const test::Run r = test::shell(mpirun(fmt::format("-np 1 {} {} {} : -np 1 {} {} {}", K3FLOW_BIN, args,
                                                     prompt, K3FLOW_BIN, args, dir / "none")),
                                  60);
  REQUIRE_MESSAGE(r.code == 0, r.err);
  CHECK(r.out == one.out);  // the continuation, once, byte for byte
}

TEST_CASE("faults under mpirun end every rank's run with one clear error, never a hang") {
  if (!have_mpi()) return;
  Synth& s = synth();
  const std::string gen = "generate {} --ids 1,2,3 --gen 3 --no-progress";

  SUBCASE("a rank whose shard is truncated: every rank exits 1, one line names the rank and the file") {
    // Rank 1 sees the checkpoint through a directory where one shard is cut short.
    const std::string bad = s.dir / "bad";
    fs::remove_all(bad);
    const std::string cut = with_truncated_file(
        s.model, bad, [](const fs::path& f) { return f.filename().string().find("model-00002") == 0; });
    REQUIRE(!cut.empty());
    const test::Run r = test::shell(
        mpirun(fmt::format("-np 1 {} {} : -np 1 {} {}", K3FLOW_BIN, fmt::format(fmt::runtime(gen), s.model),
                           K3FLOW_BIN, fmt::format(fmt::runtime(gen), bad))),
        60);
    check_slice_refused(r, cut);
  }
  SUBCASE("a rank killed at its first expert exchange: the job ends, naming the rank") {
    const test::Run r = test::shell(mpirun(fmt::format("-x K3FLOW_DIST_FAULT=1:exit -np 3 {} {}", K3FLOW_BIN,
                                                       fmt::format(fmt::runtime(gen), s.model))),
                                    60);
    CHECK_FALSE(r.timed_out);
    CHECK(r.code != 0);
    CHECK(r.err.find("rank 1") != std::string::npos);
  }
  SUBCASE("a rank that stops answering: the others give up after K3FLOW_DIST_TIMEOUT and abort the job") {
    const test::Run r =
        test::shell(mpirun(fmt::format("-x K3FLOW_DIST_FAULT=2:stall -x K3FLOW_DIST_TIMEOUT=2 -np 3 {} {}",
                                       K3FLOW_BIN, fmt::format(fmt::runtime(gen), s.model))),
                    60);
    CHECK_FALSE(r.timed_out);
    CHECK(r.code != 0);
    CHECK(r.err.find("no reply from the other ranks within 2 s during the expert exchange") !=
          std::string::npos);
  }
  SUBCASE("streamed: a rank whose packed trunk is truncated: every rank exits 1, one line names it") {
    const std::string packed = s.dir / "packed", bad = s.dir / "bad-trunk";
    if (!fs::exists(packed)) {
      const test::Run p = test::k3flow(fmt::format("pack-trunk {} {}", s.model, packed));
      REQUIRE_MESSAGE(p.code == 0, p.err);
    }
    fs::remove_all(bad);
    fs::copy(packed, bad);
    fs::resize_file(fs::path(bad) / "trunk.bin", fs::file_size(fs::path(bad) / "trunk.bin") / 2);
    const std::string streamed = gen + " --preset ultra --trunk {}";
    const test::Run r =
        test::shell(mpirun(fmt::format("-np 1 {} {} : -np 1 {} {}", K3FLOW_BIN,
                                       fmt::format(fmt::runtime(streamed), s.model, packed), K3FLOW_BIN,
                                       fmt::format(fmt::runtime(streamed), s.model, bad))),
                    60);
    CHECK_FALSE(r.timed_out);
    CHECK(r.code == 1);
    CHECK(count(r.err, "k3flow: ") == 1);
    const std::string line = line_with(r.err, "k3flow: ");
    CHECK(line.find("rank 1 of 2") != std::string::npos);
    CHECK(line.find("bad-trunk") != std::string::npos);
  }
  SUBCASE("commands other than generate, chat and serve are refused under mpirun once, as usage") {
    const test::Run chat = test::shell(mpirun(fmt::format("-np 2 {} inspect {}", K3FLOW_BIN, s.model)), 60);
    CHECK(chat.code == 2);
    CHECK(count(chat.err, "k3flow: ") == 1);
    CHECK(chat.err.find("only `generate`, `chat` and `serve` run over several ranks") != std::string::npos);
  }
}

namespace {

// Every "token_ids":[...] array in a response body (one per streamed chunk), concatenated.
std::vector<int32_t> token_ids(const std::string& body) {
  std::vector<int32_t> ids;
  const std::string key = "\"token_ids\":[";
  for (size_t at = body.find(key); at != std::string::npos; at = body.find(key, at)) {
    at += key.size();
    std::istringstream in(body.substr(at, body.find(']', at) - at));
    std::string id;
    while (std::getline(in, id, ',')) ids.push_back(int32_t(std::stol(id)));
  }
  return ids;
}

std::string completion(const std::string& prompt, int max_tokens, bool stream) {
  return fmt::format(R"({{"prompt":"{}","max_tokens":{},"stream":{},"return_token_ids":true}})", prompt,
                     max_tokens, stream ? "true" : "false");
}

// A streamed completion on its own connection; `on_first` runs once its first event has arrived.
std::vector<int32_t> streamed_ids(int port, const std::string& body, const std::function<void()>& on_first) {
  const int fd = test::connect_loopback(port);
  REQUIRE(fd >= 0);
  REQUIRE(test::send_all(fd, test::request_text("POST", "/v1/completions", body, {})));
  std::string raw;
  bool first = false;
  char buf[65536];
  for (;;) {
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    raw.append(buf, size_t(n));
    if (!first && raw.find("data: ") != std::string::npos) {
      first = true;
      on_first();
    }
  }
  ::close(fd);
  const test::HttpResponse r = test::parse_response(raw);
  CHECK(r.status == 200);
  return token_ids(r.body);
}

// `k3flow generate --print-ids`: the ids it generates for `prompt`.
std::vector<int32_t> generate_ids(const std::string& model, const std::string& prompt, int gen) {
  const test::Run r = test::k3flow_sh(
      fmt::format("generate {} --prompt '{}' --gen {} --print-ids --no-progress", model, prompt, gen), "",
      120);
  REQUIRE_MESSAGE(r.code == 0, r.err);
  const size_t at = r.out.rfind("\nids:");
  REQUIRE(at != std::string::npos);
  std::vector<int32_t> ids;
  std::istringstream in(r.out.substr(at + 5));
  int32_t id = 0;
  while (in >> id) ids.push_back(id);
  return ids;
}

// Rank 0's pid, from the line serve prints under mpirun.
pid_t rank0_pid(const std::string& err) {
  const size_t at = err.find("rank 0 of ");
  const size_t pid = at == std::string::npos ? at : err.find("(pid ", at);
  return pid == std::string::npos ? -1 : pid_t(std::atoi(err.c_str() + pid + 5));
}

}  // namespace

TEST_CASE("mpirun serve: rank 0 answers HTTP, the others follow its steps: generate's ids, SIGTERM exits 0") {
  if (!have_mpi()) return;
  const std::string tiny = test::fixture_path("tiny-k3");
  const std::vector<int32_t> want_a = generate_ids(tiny, "Hello", 16),
                             want_b = generate_ids(tiny, "The quick brown fox", 6);
  // N = 2 resident; N = 3 each rank streaming its slice at its floor (every step, more setups:
  // test_dist_serve, ranks as threads).
  for (const auto& [n_, flags] : {std::pair<int, std::string>{2, ""}, {3, "--preset ultra"}}) {
    const auto& n = n_;  // doctest's lambdas need a variable: clang 14 cannot capture a binding
    CAPTURE(n);
    test::ServeChild s(fmt::format("{} --max-seqs 2 --no-progress {}", tiny, flags), kMpiEnv, true, 120,
                       mpirun_argv(n));
    CHECK(count(s.out(), "listening on") == 1);  // rank 0 alone
    // B joins while A decodes: it is submitted once A's first id has arrived.
    std::vector<int32_t> got_b;
    std::thread b;
    const std::vector<int32_t> got_a = streamed_ids(s.port(), completion("Hello", 16, true), [&] {
      b = std::thread([&] {
        got_b = token_ids(
            test::http(s.port(), "POST", "/v1/completions", completion("The quick brown fox", 6, false))
                .body);
      });
    });
    if (b.joinable()) b.join();
    CHECK(got_a == want_a);
    CHECK(got_b == want_b);
    // SIGTERM to rank 0 drains the server; it sends the stop order and every rank exits 0 (mpirun's
    // own exit code is 0 only when every rank's is).
    const pid_t pid = rank0_pid(s.err());
    REQUIRE(pid > 0);
    ::kill(pid, SIGTERM);
    CHECK(s.wait_exit(30) == 0);
    CHECK_FALSE(s.running());
    CHECK(count(s.err(), "k3flow serve: stopped by SIGTERM") == 1);
    CHECK(count(s.err(), "k3flow: ") == 0);
  }
}

TEST_CASE("mpirun serve faults: a follower that cannot load or dies in a step ends the run, named") {
  if (!have_mpi()) return;
  const std::string tiny = test::fixture_path("tiny-k3");
  SUBCASE("rank 1 sees a truncated shard: every rank exits 1, one line names the rank and the file") {
    test::TempDir dir;
    const std::string bad = dir / "bad";
    const std::string cut =
        with_truncated_file(tiny, bad, [](const fs::path& f) { return f.extension() == ".safetensors"; });
    REQUIRE(!cut.empty());
    const std::string serve = "serve {} --port 0 --no-progress";
    const test::Run r = test::shell(
        mpirun(fmt::format("-np 1 {} {} : -np 1 {} {}", K3FLOW_BIN, fmt::format(fmt::runtime(serve), tiny),
                           K3FLOW_BIN, fmt::format(fmt::runtime(serve), bad))),
        60);
    check_slice_refused(r, cut);
  }
  SUBCASE("rank 1 killed at its first expert exchange: the request fails and the job ends, naming the rank") {
    test::ServeChild s(tiny + " --no-progress", kMpiEnv, true, 120,
                       mpirun_argv(2, {"-x", "K3FLOW_DIST_FAULT=1:exit"}));
    const test::HttpResponse r =
        test::http(s.port(), "POST", "/v1/completions", completion("Hello", 4, false), {}, 60);
    CHECK(r.status != 200);
    const int code = s.wait_exit(30);
    CHECK_FALSE(s.running());
    CHECK(code != 0);
    CHECK(s.err().find("rank 1") != std::string::npos);
  }
}
