// `k3flow generate` driven as a child with its logits dump and one-line run report, for the tests
// that compare streamed runs byte for byte (test_streaming_run, test_codec_stream): the run's ids,
// logits bytes, report and stdout, and a field of the report.
#pragma once
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "tests/run_helpers.hpp"

namespace k3::test {

inline const std::string kTinyK3 = std::string(K3_FIXTURES) + "/tiny-k3";
// tiny-k3's golden ids for the reference prompt.
inline const std::string kTinyFull =
    "203,34,2,239,195,71,163,54,121,104,16,16,219,63,4,31,48,193,57,231,219,205,145,117,79,208,18,1,74,125,"
    "66,121";

// A field of the one-line run report: its text (an array's items without the brackets).
inline std::string field(const std::string& json, const std::string& key) {
  const size_t at = json.find("\"" + key + "\":");
  if (at == std::string::npos) return "<missing " + key + ">";
  size_t b = at + key.size() + 3, e = b;
  if (json[b] == '[') {
    e = json.find(']', b);
    return json.substr(b + 1, e - b - 1);
  }
  while (e < json.size() && json[e] != ',' && json[e] != '}') ++e;
  return json.substr(b, e - b);
}
inline uint64_t num(const std::string& json, const std::string& key) {
  return std::strtoull(field(json, key).c_str(), nullptr, 10);
}

struct Output {
  std::string ids, logits, report, out;
};

// generate MODEL --ids IDS FLAGS with its logits dump and report in `d`; requires exit 0.
inline Output generate(const std::string& model, const std::string& ids, const std::string& flags,
                       const TempDir& d, const std::string& env = "") {
  namespace fs = std::filesystem;
  fs::remove(d / "l.bin");
  fs::remove(d / "r.json");
  const Run r = k3flow(fmt::format("generate {} --ids {} --dump-logits {} --out {} {}", model, ids,
                                   d / "l.bin", d / "r.json", flags),
                       env);
  INFO(flags);
  INFO(r.out);
  INFO(r.err);
  REQUIRE(!r.timed_out);
  REQUIRE(r.code == 0);
  Output o;
  o.out = r.out;
  o.report = slurp(d / "r.json");
  o.ids = field(o.report, "generated_ids");
  o.logits = slurp(d / "l.bin");
  return o;
}

}  // namespace k3::test
