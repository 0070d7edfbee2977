// io/env: the one table of environment variables. Its reads' rules, and that it is the whole truth:
// README's environment tables list exactly its names, and no source file calls getenv around it.
#include <doctest/doctest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <regex>
#include <set>
#include <stdexcept>
#include <string>

#include "io/env.hpp"

namespace fs = std::filesystem;
namespace env = k3::io::env;

namespace {

std::string slurp(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

// Sets a variable for one scope (unset again at its end).
struct Scoped {
  const char* name;
  Scoped(const env::Var& v, const char* value) : name(v.name.data()) { ::setenv(name, value, 1); }
  ~Scoped() { ::unsetenv(name); }
};

}  // namespace

TEST_CASE("every name is unique, prefixed K3FLOW_ or K3_, and described; settings come before test hooks") {
  std::set<std::string_view> names;
  bool hooks_started = false;
  for (const env::Var& v : env::kAll) {
    CAPTURE(v.name);
    CHECK(names.insert(v.name).second);
    CHECK((v.name.starts_with("K3FLOW_") || v.name.starts_with("K3_")));
    CHECK(!v.meaning.empty());
    CHECK(&env::find(v.name) == &v);
    if (v.kind == env::Kind::test_hook) hooks_started = true;
    CHECK_FALSE((hooks_started && v.kind == env::Kind::setting));
  }
  CHECK_THROWS_AS(env::find("K3FLOW_NOT_A_VARIABLE"), std::logic_error);
}

TEST_CASE("reads: empty is unset, flags are anything but 0, numbers parse as before") {
  const env::Var& v = env::kTestMemAvailable;  // nothing in this test reads it otherwise
  ::unsetenv(v.name.data());
  CHECK_FALSE(env::text(v));
  CHECK_FALSE(env::flag(v));
  CHECK_FALSE(env::integer(v));
  CHECK(env::integer_or_zero(v) == 0);
  CHECK_FALSE(env::u64(v));
  {
    Scoped s(v, "");
    CHECK_FALSE(env::text(v));
    CHECK_FALSE(env::flag(v));
    CHECK_FALSE(env::integer(v));
  }
  {
    Scoped s(v, "0");
    CHECK(env::text(v) == "0");
    CHECK_FALSE(env::flag(v));
    CHECK(env::integer(v) == 0);  // "0" is a value, not unset
    CHECK(env::u64(v) == 0u);
  }
  {
    Scoped s(v, "1");
    CHECK(env::flag(v));
  }
  {
    Scoped s(v, "kill");
    CHECK(env::flag(v));
    CHECK(env::text(v) == "kill");
  }
  {
    Scoped s(v, "18446744073709551615");
    CHECK(env::u64(v) == 18446744073709551615ull);
  }
  {
    Scoped s(v, "-3");
    CHECK(env::integer(v) == -3);
    CHECK(env::integer_or_zero(v) == -3);
  }
}

TEST_CASE("README's environment tables name exactly the variables of io/env.hpp") {
  const std::string readme = slurp(fs::path(K3_SOURCE_DIR) / "README.md");
  const size_t from = readme.find("## Environment\n");
  REQUIRE(from != std::string::npos);
  const std::string section = readme.substr(from, readme.find("\n## ", from + 1) - from);
  std::set<std::string> listed;
  const std::regex name(R"(\bK3(FLOW)?_[A-Z0-9_]+\b)");
  for (auto it = std::sregex_iterator(section.begin(), section.end(), name); it != std::sregex_iterator();
       ++it)
    listed.insert(it->str());
  std::set<std::string> table;
  for (const env::Var& v : env::kAll) table.insert(std::string(v.name));
  CHECK(listed == table);
}

TEST_CASE("no source file reads the environment around the table") {
  // kernels/dispatch.cpp reads K3FLOW_ISA itself (the kernels link nothing); test_dispatch saves
  // and restores it. tests/sparse_replica.hpp reads K3_REPLICA, which only ctest sets (the
  // replica_synth fixture's directory): a harness hand-over, not a setting of the engine.
  const std::set<std::string> allowed = {"io/env.cpp", "kernels/dispatch.cpp", "tests/test_dispatch.cpp",
                                         "tests/test_env.cpp", "tests/sparse_replica.hpp"};
  std::set<std::string> readers;
  for (const char* dir : {"io", "kernels", "stages", "pipeline", "perf", "tests"})
    for (const auto& e : fs::recursive_directory_iterator(fs::path(K3_SOURCE_DIR) / dir)) {
      const std::string ext = e.path().extension().string();
      if (!e.is_regular_file() || (ext != ".cpp" && ext != ".hpp" && ext != ".cc")) continue;
      if (slurp(e.path()).find("getenv(") == std::string::npos) continue;
      readers.insert(fs::relative(e.path(), K3_SOURCE_DIR).string());
    }
  for (const std::string& f : readers) {
    CAPTURE(f);
    CHECK(allowed.count(f) == 1);
  }
}
