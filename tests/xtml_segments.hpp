// Expected XTML renders, spelled as the reference segments them (tests/test_xtml*.cpp): a control
// token C(...) apart from the text T(...) around it, a tag's name apart from its attributes.
#pragma once
#include <string>
#include <utility>
#include <vector>

#include "io/text/xtml.hpp"

namespace k3::test {

inline io::text::Segment C(std::string t) {
  return io::text::Segment{std::move(t), true};
}
inline io::text::Segment T(std::string t) {
  return io::text::Segment{std::move(t), false};
}
// <|open|>tag attr attr<|sep|>, each attribute its own text segment (" key=\"value\"").
inline std::vector<io::text::Segment> open_tag(const std::string& tag, std::vector<std::string> attrs = {}) {
  std::vector<io::text::Segment> s = {C("<|open|>"), T(tag)};
  for (auto& a : attrs) s.push_back(T(std::move(a)));
  s.push_back(C("<|sep|>"));
  return s;
}
inline std::vector<io::text::Segment> close_tag(const std::string& tag) {
  return {C("<|close|>"), T(tag), C("<|sep|>")};
}

}  // namespace k3::test
