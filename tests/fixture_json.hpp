// Test helper: read fixtures/*.json (docs/model.md §6.1) with simdjson. Tensors are {"shape":[...],
// "data":[flat row-major numbers]}; scalars are numbers or bools. Anything missing or malformed
// throws, so a fixture that cannot be loaded fails its test instead of skipping it.
#pragma once
#include <simdjson.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace k3::test {

struct Tensor {
  std::vector<size_t> shape;
  std::vector<float> data;  // exact for the byte- and dyadic-valued fixtures, f32-rounded otherwise

  size_t numel() const { return data.size(); }
  // Slice i of the leading dimension, e.g. row i of a [rows][cols] tensor.
  std::span<const float> row(size_t i) const {
    const size_t inner = shape.empty() || shape[0] == 0 ? 0 : data.size() / shape[0];
    return std::span<const float>(data).subspan(i * inner, inner);
  }
  template <class T>
  std::vector<T> as() const {
    return std::vector<T>(data.begin(), data.end());
  }
};

inline std::string fixture_path(std::string_view relative) {
  return std::string(K3_FIXTURES) + "/" + std::string(relative);
}

class Fixture {
 public:
  // `path` absolute, or relative to the fixtures directory (e.g. "ops/rmsnorm.json").
  explicit Fixture(const std::string& path)
      : path_(path.starts_with("/") ? path : fixture_path(path)),
        parser_(std::make_unique<simdjson::dom::parser>()) {
    auto doc = parser_->load(path_);
    if (doc.error()) fail("cannot load: " + std::string(simdjson::error_message(doc.error())));
    root_ = doc.value_unsafe();
  }

  const std::string& path() const { return path_; }
  simdjson::dom::element root() const { return root_; }

  bool has(std::string_view key) const { return !root_.at_key(key).error(); }

  simdjson::dom::element at(std::string_view key) const {
    auto e = root_.at_key(key);
    if (e.error()) fail("no key '" + std::string(key) + "'");
    return e.value_unsafe();
  }

  Tensor tensor(std::string_view key) const { return to_tensor(at(key), key); }

  double number(std::string_view key) const { return to_number(at(key), key); }
  size_t count(std::string_view key) const { return static_cast<size_t>(number(key)); }

  // true/false, or a number (nonzero = true), as the fixtures spell flags both ways.
  bool boolean(std::string_view key) const {
    const auto e = at(key);
    if (e.is_bool()) return e.get_bool().value_unsafe();
    return to_number(e, key) != 0.0;
  }

  std::vector<double> numbers(std::string_view key) const {
    auto arr = at(key).get_array();
    if (arr.error()) fail("'" + std::string(key) + "' is not an array");
    std::vector<double> out;
    for (auto v : arr.value_unsafe()) out.push_back(to_number(v, key));
    return out;
  }

  Tensor to_tensor(simdjson::dom::element e, std::string_view key) const {
    Tensor t;
    auto shape = e.at_key("shape").get_array();
    auto data = e.at_key("data").get_array();
    if (shape.error() || data.error()) fail("'" + std::string(key) + "' is not a {shape, data} tensor");
    size_t want = 1;
    for (auto d : shape.value_unsafe()) {
      t.shape.push_back(static_cast<size_t>(to_number(d, key)));
      want *= t.shape.back();
    }
    t.data.reserve(want);
    for (auto v : data.value_unsafe()) t.data.push_back(static_cast<float>(to_number(v, key)));
    if (t.data.size() != want) {
      fail("'" + std::string(key) + "' has " + std::to_string(t.data.size()) + " values, shape says " +
           std::to_string(want));
    }
    return t;
  }

 private:
  double to_number(simdjson::dom::element e, std::string_view key) const {
    if (e.is_double()) return e.get_double().value_unsafe();
    if (e.is_int64()) return static_cast<double>(e.get_int64().value_unsafe());
    if (e.is_uint64()) return static_cast<double>(e.get_uint64().value_unsafe());
    fail("'" + std::string(key) + "' is not a number");
    return 0.0;
  }

  [[noreturn]] void fail(const std::string& what) const { throw std::runtime_error(path_ + ": " + what); }

  std::string path_;
  std::unique_ptr<simdjson::dom::parser> parser_;
  simdjson::dom::element root_;
};

// |got - want| <= atol + rtol * |want|, MANIFEST.json tolerance.fp32_abs / fp32_rel.
struct Tolerance {
  double atol = 1e-5;
  double rtol = 1e-4;
};

// The manifest is required: an unreadable one throws rather than silently loosening the bound.
inline Tolerance manifest_tolerance() {
  Fixture m("ops/MANIFEST.json");
  auto tol = m.at("tolerance");
  Tolerance t;
  t.atol = tol.at_key("fp32_abs").get_double().value();
  t.rtol = tol.at_key("fp32_rel").get_double().value();
  return t;
}

struct Comparison {
  size_t n = 0, bad = 0, nonfinite = 0, size_mismatch = 0;
  double worst = 0.0;  // max |got - want| / (atol + rtol |want|)
  size_t worst_at = 0;
  float worst_got = 0.0f, worst_want = 0.0f;

  bool ok() const { return bad == 0 && nonfinite == 0 && size_mismatch == 0; }
  std::string str() const {
    std::ostringstream s;
    s << "n=" << n << " bad=" << bad << " nonfinite=" << nonfinite << " worst=" << worst << "x tol at ["
      << worst_at << "] got " << worst_got << " want " << worst_want;
    if (size_mismatch) s << " SIZE MISMATCH";
    return s.str();
  }
};

// Non-finite outputs always fail (the reference harnesses let NaN through; this one does not).
inline Comparison compare(std::span<const float> got, std::span<const float> want, Tolerance tol) {
  Comparison c;
  c.n = want.size();
  if (got.size() != want.size()) c.size_mismatch = 1;
  const size_t n = std::min(got.size(), want.size());
  for (size_t i = 0; i < n; ++i) {
    if (!std::isfinite(got[i])) {
      ++c.nonfinite;
      continue;
    }
    const double bound = tol.atol + tol.rtol * std::fabs(static_cast<double>(want[i]));
    const double err = std::fabs(static_cast<double>(got[i]) - static_cast<double>(want[i]));
    if (err > bound) ++c.bad;
    if (err / bound > c.worst) {
      c.worst = err / bound;
      c.worst_at = i;
      c.worst_got = got[i];
      c.worst_want = want[i];
    }
  }
  return c;
}

inline Comparison compare_abs(std::span<const float> got, std::span<const float> want, double atol) {
  return compare(got, want, Tolerance{atol, 0.0});
}

}  // namespace k3::test
