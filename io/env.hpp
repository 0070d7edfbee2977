// Every environment variable k3flow reads, in one table: its name, what it means, and whether it
// is a user setting (documented in README "Environment") or a test hook (a way for the tests to
// slow, starve or break a run on purpose; never needed by a user). Nothing else calls getenv: a
// variable that is not listed here is not read (kernels/dispatch.cpp reads K3FLOW_ISA itself,
// since the kernels link nothing; it is listed so the table is complete).
//
// README's environment table and tests/test_env.cpp are kept to this list.
#pragma once
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>

namespace k3::io::env {

enum class Kind { setting, test_hook };

struct Var {
  std::string_view name;
  Kind kind;
  std::string_view meaning;
};

// ---- user settings ----
inline constexpr Var kIsa{"K3FLOW_ISA", Kind::setting,
                          "scalar|avx2|avx512: force a kernel body (same bits, different speed); an "
                          "unsupported one falls back to the best available"};
inline constexpr Var kNoUring{"K3FLOW_NO_URING", Kind::setting,
                              "any value but 0: positioned pread instead of io_uring (same bits)"};
inline constexpr Var kTrunkQd{"K3FLOW_TRUNK_QD", Kind::setting, "trunk reader queue depth (default 4)"};
inline constexpr Var kTrunkChunkKb{"K3FLOW_TRUNK_CHUNK_KB", Kind::setting,
                                   "trunk reader chunk size in KiB (default 1024)"};
inline constexpr Var kTrunkMaxQd{"K3FLOW_TRUNK_MAX_QD", Kind::setting,
                                 "the trunk reader's adaptive depth cap (default 64; equal to "
                                 "K3FLOW_TRUNK_QD: a fixed depth)"};
inline constexpr Var kTrunkGatedQd{"K3FLOW_TRUNK_GATED_QD", Kind::setting,
                                   "the trunk reader's depth while an urgent expert read is out"};
inline constexpr Var kExpertQd{
    "K3FLOW_EXPERT_QD", Kind::setting,
    "expert reader queue depth (default 4, adaptive up to 4 a sequence in a batched run; set: fixed)"};
inline constexpr Var kExpertChunkKb{"K3FLOW_EXPERT_CHUNK_KB", Kind::setting,
                                    "expert reader chunk size in KiB (default a quarter expert)"};
inline constexpr Var kNoHuge{"K3_NOHUGE", Kind::setting,
                             "any value but 0: 4 KiB instead of 2 MiB alignment and no huge-page advice "
                             "for large buffers"};
inline constexpr Var kDistTimeout{"K3FLOW_DIST_TIMEOUT", Kind::setting,
                                  "seconds an MPI rank waits in an expert exchange before it aborts the "
                                  "run (default 300; docs/distributed.md §5)"};
inline constexpr Var kDistLoadTimeout{"K3FLOW_DIST_LOAD_TIMEOUT", Kind::setting,
                                      "seconds an MPI rank waits for the other ranks to load their slices "
                                      "(default 7200)"};

// ---- test hooks ----
inline constexpr Var kFailAfterBytes{"K3FLOW_FAIL_AFTER_BYTES", Kind::test_hook,
                                     "N: pack-trunk stops after N bytes (see K3FLOW_FAIL_MODE)"};
inline constexpr Var kFailMode{"K3FLOW_FAIL_MODE", Kind::test_hook,
                               "kill|wait: at K3FLOW_FAIL_AFTER_BYTES, SIGKILL itself or wait for a "
                               "signal (default: throw)"};
inline constexpr Var kSynthFailAfter{"K3_SYNTH_FAIL_AFTER", Kind::test_hook,
                                     "N: synth fails after N data bytes"};
inline constexpr Var kTestStepDelayMs{"K3FLOW_TEST_STEP_DELAY_MS", Kind::test_hook,
                                      "N: sleep N ms before every streamed forward call but the first"};
inline constexpr Var kTestReadDelayMs{"K3FLOW_TEST_READ_DELAY_MS", Kind::test_hook,
                                      "N: every streamed read lands N ms later (a slow disk)"};
inline constexpr Var kTestLoadDelayMs{"K3FLOW_TEST_LOAD_DELAY_MS", Kind::test_hook,
                                      "N: serve waits N ms before it opens the model (a slow load)"};
inline constexpr Var kTestChatReply{"K3FLOW_TEST_CHAT_REPLY", Kind::test_hook,
                                    "TEXT: chat starts every reply with TEXT (the chat format's markers "
                                    "included) as if the model had generated it"};
inline constexpr Var kTestMemAvailable{"K3FLOW_TEST_MEM_AVAILABLE", Kind::test_hook,
                                       "BYTES: the memory the machine has available (instead of "
                                       "MemAvailable capped by the cgroup limit)"};
inline constexpr Var kBenchChild{"K3FLOW_BENCH_CHILD", Kind::test_hook,
                                 "PATH: bench runs `PATH generate ...` instead of this executable"};
inline constexpr Var kDistFault{"K3FLOW_DIST_FAULT", Kind::test_hook,
                                "R:exit|R:stall: MPI rank R kills itself or stops answering at its first "
                                "expert exchange"};
inline constexpr Var kFuzzTmpdir{"K3_FUZZ_TMPDIR", Kind::test_hook,
                                 "DIR: the fuzz targets' scratch directory (tests/fuzz, not k3flow)"};

inline constexpr Var kAll[] = {
    kIsa,        kNoUring,         kTrunkQd,         kTrunkChunkKb,    kTrunkMaxQd,       kTrunkGatedQd,
    kExpertQd,   kExpertChunkKb,   kNoHuge,          kDistTimeout,     kDistLoadTimeout,  kFailAfterBytes,
    kFailMode,   kSynthFailAfter,  kTestStepDelayMs, kTestReadDelayMs, kTestMemAvailable, kBenchChild,
    kFuzzTmpdir, kTestLoadDelayMs, kDistFault,       kTestChatReply};

// The listed variable named `name`; a name that is not listed is a programming error (logic_error).
const Var& find(std::string_view name);

// Reads. "Unset" means not in the environment or set to the empty string.
std::optional<std::string_view> text(const Var& v);  // unset: none
bool flag(const Var& v);                             // set and not "0"
std::optional<int> integer(const Var& v);            // atoi of the text; unset: none ("0" is a value)
int integer_or_zero(const Var& v);                   // atoi of the text; unset: 0
std::optional<uint64_t> u64(const Var& v);           // strtoull of the text; unset: none

// The number of ranks an MPI launcher started this process's job with (Open MPI's
// OMPI_COMM_WORLD_SIZE, else PMI_SIZE / PMIX_SIZE; 1 for PMIX_RANK alone); 0 when no launcher started
// it. The launcher's variables, not k3flow's settings: read here so nothing else calls getenv.
int launcher_ranks();

}  // namespace k3::io::env
