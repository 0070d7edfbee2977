// fixtures/convert_tiny_k3.py: re-running the converter reproduces the committed fixtures/tiny-k3
// byte for byte (so the embedded default model is exactly what the script says it is).
#include <doctest/doctest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "tests/fixture_json.hpp"
#include "tests/temp_dir.hpp"

namespace fs = std::filesystem;

namespace {
std::string slurp(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  REQUIRE(f.good());
  return std::string(std::istreambuf_iterator<char>(f), {});
}
}  // namespace

TEST_CASE("convert_tiny_k3.py output is byte-identical to the committed fixtures/tiny-k3") {
  const k3::test::TempDir tmp("k3conv.");
  const fs::path out = tmp.path / "tiny-k3";
  const std::string cmd = "/usr/bin/python3 " + k3::test::fixture_path("convert_tiny_k3.py") + " --src " +
                          std::string(K3_FIXTURES) + " --out " + out.string() + " > /dev/null";
  REQUIRE(std::system(cmd.c_str()) == 0);
  for (const char* name : {"config.json", "model-00001-of-000001.safetensors", "model.safetensors.index.json",
                           "tiktoken.model", "tokenizer_config.json"}) {
    CAPTURE(name);
    const std::string got = slurp(out / name),
                      want = slurp(k3::test::fixture_path(std::string("tiny-k3/") + name));
    CHECK(got.size() == want.size());
    CHECK(got == want);
  }
  size_t files = 0;
  for (const auto& e : fs::directory_iterator(k3::test::fixture_path("tiny-k3")))
    files += e.is_regular_file();
  CHECK(files == 5);  // nothing else in the committed directory
}
