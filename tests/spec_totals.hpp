// What generate --spec prints, for the speculative tests: a line of its output, and the numbers of
// its "speculative: D drafted, A accepted ...; P passes (V verify) for T tokens" and "speculative
// policy: ...; K pauses, Q tokens decoded without drafting" lines (-1 where a line is missing).
#pragma once
#include <cstdio>
#include <string>

namespace k3::test {

// The line of `out` that starts at the first `what`, or "<no what>".
inline std::string line_with(const std::string& out, const std::string& what) {
  const size_t at = out.find(what);
  if (at == std::string::npos) return "<no " + what + ">";
  return out.substr(at, out.find('\n', at) - at);
}

struct SpecTotals {
  long drafted = -1, accepted = -1, passes = -1, verify = -1, tokens = -1, pauses = -1, paused = -1;
  // Rows fed after the prompt's pass, per token after the first: plain decoding's is 1.
  double rows_per_token() const { return double(passes - 1 + drafted) / double(tokens - 1); }
};

inline SpecTotals spec_totals(const std::string& out) {
  SpecTotals t;
  const std::string l = line_with(out, "speculative: ");
  std::sscanf(l.c_str(),
              "speculative: %ld drafted, %ld accepted (acceptance %*f); %ld passes (%ld verify) for %ld",
              &t.drafted, &t.accepted, &t.passes, &t.verify, &t.tokens);
  const std::string p = line_with(out, "speculative policy: ");
  const size_t at = p.find("; ");
  if (at != std::string::npos) std::sscanf(p.c_str() + at, "; %ld pauses, %ld tokens", &t.pauses, &t.paused);
  return t;
}

}  // namespace k3::test
