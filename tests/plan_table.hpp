// The plan table a command prints (`k3flow plan`, or the plan `generate` prints before it runs): its
// "plan: budget" line and every indented line after it, so two commands' plans compare as text.
#pragma once
#include <string>

namespace k3::test {

inline std::string plan_table(const std::string& out) {
  const size_t b = out.find("plan: budget");
  if (b == std::string::npos) return "<no plan in the output>";
  size_t e = out.find('\n', b);
  if (e == std::string::npos) return "<no plan end>";
  ++e;
  while (out.compare(e, 2, "  ") == 0) {
    const size_t n = out.find('\n', e);
    if (n == std::string::npos) return "<no plan end>";
    e = n + 1;
  }
  return out.find("  trunk read per token", b) < e ? out.substr(b, e - b) : "<no plan end>";
}

}  // namespace k3::test
