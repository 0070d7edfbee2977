// safetensors shard set (docs/engine.md §1.2): headers only are read at open; every refusal is one line
// `<shard file>: <tensor>: <what is wrong>`. Lengths and offsets from the file are checked before
// they are used and all arithmetic on them is overflow-checked.
#include "io/safetensors.hpp"

#include <fmt/format.h>
#include <simdjson.h>

#include <algorithm>
#include <map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "io/error.hpp"
#include "io/file.hpp"
#include "io/safetensors_index.hpp"

namespace k3::io {

namespace fs = std::filesystem;
namespace dom = simdjson::dom;

const char* dtype_name(DType d) {
  switch (d) {
    case DType::U8:
      return "U8";
    case DType::BF16:
      return "BF16";
    case DType::F16:
      return "F16";
    case DType::F32:
      return "F32";
  }
  return "?";
}

size_t dtype_size(DType d) {
  switch (d) {
    case DType::U8:
      return 1;
    case DType::BF16:
      return 2;
    case DType::F16:
      return 2;
    case DType::F32:
      return 4;
  }
  return 0;
}

uint64_t TensorInfo::numel() const {
  uint64_t n = 1;
  for (unsigned i = 0; i < rank; ++i) n *= shape[i];
  return n;
}

namespace {

constexpr std::string_view kIndexFile = "model.safetensors.index.json";
// The safetensors library's own limit; the real shards' headers are ~1.1 MB.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

// A tensor name fit for a one-line message: control bytes, DEL and bytes that are not UTF-8 are
// shown as \xNN.
std::string printable(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = p[i];
    size_t len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    bool ok = len > 0 && i + len <= s.size();
    for (size_t k = 1; ok && k < len; ++k) ok = (p[i + k] & 0xC0) == 0x80;
    if (ok && len == 1 && (c < 0x20 || c == 0x7F)) ok = false;
    if (!ok) {
      out += fmt::format("\\x{:02X}", c);
      ++i;
    } else {
      out.append(s.substr(i, len));
      i += len;
    }
  }
  return out;
}

Error refuse(const fs::path& file, std::string_view tensor, const std::string& what) {
  return runtime_error(fmt::format("{}: {}: {}", file.string(), printable(tensor), what));
}

Error refuse_file(const fs::path& file, const std::string& what) {
  return runtime_error(fmt::format("{}: {}", file.string(), what));
}

// Offset of the first byte that is not valid UTF-8 (overlong forms, surrogates and code points
// above U+10FFFF included), or s.size().
size_t first_invalid_utf8(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  for (size_t i = 0; i < n;) {
    const unsigned c = p[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    size_t len;
    unsigned lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) {
      len = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
      len = 3;
      if (c == 0xE0) lo = 0xA0;
      if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
      len = 4;
      if (c == 0xF0) lo = 0x90;
      if (c == 0xF4) hi = 0x8F;
    } else {
      return i;
    }
    if (i + len > n || p[i + 1] < lo || p[i + 1] > hi) return i;
    for (size_t k = 2; k < len; ++k)
      if ((p[i + k] & 0xC0) != 0x80) return i;
    i += len;
  }
  return n;
}

// The raw text of the last top-level key that starts before `pos` (the tensor a byte of the
// header belongs to), found by a plain scan that tolerates malformed JSON.
std::string_view root_key_before(std::string_view h, size_t pos) {
  std::string_view key;
  int depth = 0;
  for (size_t i = 0; i < h.size() && i < pos; ++i) {
    const char c = h[i];
    if (c == '"') {
      const size_t start = i + 1;
      size_t j = start;
      while (j < h.size() && h[j] != '"') j += h[j] == '\\' ? 2 : 1;
      const size_t end = std::min(j, h.size());
      size_t k = end + 1;
      while (k < h.size() && (h[k] == ' ' || h[k] == '\n' || h[k] == '\r' || h[k] == '\t')) ++k;
      if (depth == 1 && (k >= h.size() || h[k] == ':' || end >= h.size())) key = h.substr(start, end - start);
      i = end;
    } else if (c == '{' || c == '[') {
      ++depth;
    } else if (c == '}' || c == ']') {
      --depth;
    }
  }
  return key;
}

// Whether every key and scalar under `v` parses; numbers are parsed too, so one that does not fit
// 64 bits fails here (the DOM parser reports it without saying where).
bool value_parses(simdjson::ondemand::value v) {
  namespace od = simdjson::ondemand;
  od::json_type type;
  if (v.type().get(type)) return false;
  switch (type) {
    case od::json_type::object: {
      od::object o;
      if (v.get_object().get(o)) return false;
      for (auto f : o) {
        std::string_view k;
        od::value x;
        if (f.error() || f.unescaped_key().get(k) || f.value().get(x) || !value_parses(x)) return false;
      }
      return true;
    }
    case od::json_type::array: {
      od::array a;
      if (v.get_array().get(a)) return false;
      for (auto e : a) {
        od::value x;
        if (e.get(x) || !value_parses(x)) return false;
      }
      return true;
    }
    case od::json_type::string: {
      std::string_view str;
      return !v.get_string().get(str);
    }
    case od::json_type::number: {
      od::number n;
      return !v.get_number().get(n);
    }
    case od::json_type::boolean: {
      bool b;
      return !v.get_bool().get(b);
    }
    case od::json_type::null: {
      bool is = false;
      return !v.is_null().get(is) && is;
    }
  }
  return false;
}

// Where the first error of a header the DOM parser refused lies: the tensor whose entry holds it
// and, when it is inside one of the entry's fields, that field's name.
struct JsonErrorAt {
  std::string tensor;
  std::string field;
};

// When the DOM parse fails, walk the header on demand to find the tensor (and field) holding the
// first error; falls back to the plain scan.
JsonErrorAt locate_json_error(std::string_view header, const simdjson::padded_string& padded) {
  namespace od = simdjson::ondemand;
  od::parser parser;
  od::document doc;
  od::object root;
  if (parser.iterate(padded).get(doc) || doc.get_object().get(root))
    return {std::string(root_key_before(header, header.size())), {}};
  JsonErrorAt at;
  for (auto entry : root) {
    std::string_view key;
    if (entry.error() || entry.unescaped_key().get(key)) return at;
    at = {std::string(key), {}};
    od::value v;
    od::json_type type;
    if (entry.value().get(v) || v.type().get(type)) return at;
    if (type != od::json_type::object) {
      if (!value_parses(v)) return at;
      continue;
    }
    od::object t;
    if (v.get_object().get(t)) return at;
    for (auto f : t) {
      at.field.clear();
      std::string_view k;
      if (f.error() || f.unescaped_key().get(k)) return at;
      at.field.assign(k);
      od::value x;
      if (f.value().get(x) || !value_parses(x)) return at;
    }
    at.field.clear();
  }
  // Every entry parses: the error is in the structure around them.
  return {std::string(root_key_before(header, header.size())), {}};
}

std::optional<DType> parse_dtype(std::string_view s) {
  if (s == "U8") return DType::U8;
  if (s == "BF16") return DType::BF16;
  if (s == "F16") return DType::F16;
  if (s == "F32") return DType::F32;
  return std::nullopt;
}

std::string shape_text(const TensorInfo& t) {
  std::string s = "[";
  for (unsigned i = 0; i < t.rank; ++i) s += fmt::format("{}{}", i ? ", " : "", t.shape[i]);
  return s + "]";
}

// One tensor as collected from a header, before the index is built.
struct RawTensor {
  uint64_t name_at;  // into Collector::names
  uint32_t name_len;
  TensorInfo info;
};

struct Collector {
  std::string names;
  std::vector<RawTensor> tensors;
  std::string_view name(const RawTensor& t) const {
    return std::string_view(names).substr(t.name_at, t.name_len);
  }
};

// Checks one header entry and returns it as a TensorInfo (offset still relative to the data start).
TensorInfo parse_entry(const fs::path& file, std::string_view name, dom::element value, uint64_t data_len) {
  dom::object obj;
  if (value.get(obj)) throw refuse(file, name, "header entry is not a JSON object");
  TensorInfo t{};
  t.shape = {1, 1, 1, 1};
  bool has_dtype = false, has_shape = false, has_offsets = false;
  uint64_t start = 0, end = 0;
  for (auto [key, v] : obj) {
    if (key == "dtype") {
      if (has_dtype) throw refuse(file, name, "dtype given twice");
      has_dtype = true;
      std::string_view s;
      if (v.get(s)) throw refuse(file, name, "dtype is not a string");
      const auto d = parse_dtype(s);
      if (!d)
        throw refuse(
            file, name,
            fmt::format("unknown dtype \"{}\" (this reader takes U8, BF16, F16, F32)", printable(s)));
      t.dtype = *d;
    } else if (key == "shape") {
      if (has_shape) throw refuse(file, name, "shape given twice");
      has_shape = true;
      dom::array a;
      if (v.get(a)) throw refuse(file, name, "shape is not an array");
      if (a.size() > 4)
        throw refuse(file, name, fmt::format("rank {} exceeds the supported maximum of 4", a.size()));
      unsigned i = 0;
      for (dom::element d : a) {
        if (d.type() != dom::element_type::INT64 && d.type() != dom::element_type::UINT64) {
          throw refuse(file, name, fmt::format("shape[{}] is not a non-negative integer", i));
        }
        if (d.type() == dom::element_type::INT64 && int64_t(d) < 0) {
          throw refuse(file, name, fmt::format("shape[{}] = {} is negative", i, int64_t(d)));
        }
        t.shape[i++] = uint64_t(d);
      }
      t.rank = static_cast<uint8_t>(i);
    } else if (key == "data_offsets") {
      if (has_offsets) throw refuse(file, name, "data_offsets given twice");
      has_offsets = true;
      dom::array a;
      if (v.get(a) || a.size() != 2) throw refuse(file, name, "data_offsets is not an array [start, end]");
      uint64_t se[2];
      int i = 0;
      for (dom::element d : a) {
        if (d.type() == dom::element_type::UINT64 ||
            (d.type() == dom::element_type::INT64 && int64_t(d) >= 0)) {
          se[i++] = uint64_t(d);
        } else {
          throw refuse(file, name, "data_offsets holds a value that is not a non-negative integer");
        }
      }
      start = se[0];
      end = se[1];
    }
    // Other keys are not part of the format; they are ignored like the references do.
  }
  if (!has_dtype) throw refuse(file, name, "no dtype");
  if (!has_shape) throw refuse(file, name, "no shape");
  if (!has_offsets) throw refuse(file, name, "no data_offsets");
  if (start > end)
    throw refuse(file, name, fmt::format("data_offsets [{}, {}] end before they start", start, end));
  if (end > data_len) {
    throw refuse(
        file, name,
        fmt::format("data_offsets [{}, {}] lie outside the data section ({} bytes)", start, end, data_len));
  }
  uint64_t numel = 1, nbytes = 0;
  for (unsigned i = 0; i < t.rank; ++i) {
    if (__builtin_mul_overflow(numel, t.shape[i], &numel)) {
      throw refuse(file, name, fmt::format("shape {} has more elements than 2^64", shape_text(t)));
    }
  }
  if (__builtin_mul_overflow(numel, uint64_t{dtype_size(t.dtype)}, &nbytes) || nbytes != end - start) {
    throw refuse(
        file, name,
        fmt::format("shape {} x {} needs {} elements x {} bytes, but data_offsets [{}, {}] hold {} bytes",
                    shape_text(t), dtype_name(t.dtype), numel, dtype_size(t.dtype), start, end, end - start));
  }
  t.offset = start;
  t.nbytes = nbytes;
  return t;
}

// Reads and checks one shard's header; appends its tensors (absolute offsets) to `out`.
void read_header(const File& file, uint32_t shard, dom::parser& parser, Collector& out) {
  const fs::path& path = file.path();
  if (file.size() < 8)
    throw refuse_file(path,
                      fmt::format("file is {} bytes, too short for the 8-byte header length", file.size()));
  unsigned char prefix[8];
  file.read_exact(0, std::as_writable_bytes(std::span(prefix)));
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = n << 8 | prefix[i];
  if (n > file.size() - 8) {
    throw refuse_file(
        path, fmt::format("header length {} runs past the end of the file ({} bytes)", n, file.size()));
  }
  if (n > kMaxHeaderBytes)
    throw refuse_file(path, fmt::format("header length {} exceeds the {}-byte limit", n, kMaxHeaderBytes));
  const uint64_t data_start = 8 + n, data_len = file.size() - data_start;

  simdjson::padded_string padded(static_cast<size_t>(n));
  file.read_exact(8, std::as_writable_bytes(std::span(padded.data(), padded.size())));
  const std::string_view header(padded.data(), padded.size());
  if (const size_t bad = first_invalid_utf8(header); bad < header.size()) {
    throw refuse(path, root_key_before(header, bad + 1),
                 fmt::format("invalid UTF-8 in the header at byte {} of the file", 8 + bad));
  }
  dom::element doc;
  if (const auto err = parser.parse(padded).get(doc)) {
    const JsonErrorAt at = locate_json_error(header, padded);
    throw refuse(path,
                 at.tensor.empty() ? std::string_view("(start of header)") : std::string_view(at.tensor),
                 fmt::format("malformed JSON in the header{} ({})",
                             at.field.empty() ? "" : fmt::format(", in \"{}\"", printable(at.field)),
                             simdjson::error_message(err)));
  }
  dom::object root;
  if (doc.get(root)) throw refuse_file(path, "header is not a JSON object");

  struct Span {
    uint64_t start, end;
    size_t tensor;
  };
  std::vector<Span> spans;
  spans.reserve(root.size());
  // Checked before the overlap test: a name listed twice with one span would otherwise be reported
  // as a tensor overlapping itself.
  std::unordered_set<std::string_view> seen;
  seen.reserve(root.size());
  for (auto [name, value] : root) {
    if (!seen.insert(name).second) {
      throw refuse(path, name,
                   fmt::format("duplicate tensor name {} in {}", printable(name), path.filename().string()));
    }
    if (name == "__metadata__") {
      // Free-form string map; skipped, but it must be one (as the safetensors library requires).
      dom::object meta;
      if (value.get(meta)) throw refuse(path, name, "is not an object of strings");
      for (auto [k, v] : meta) {
        if (!v.is_string())
          throw refuse(path, name, fmt::format("value of \"{}\" is not a string", printable(k)));
      }
      continue;
    }
    TensorInfo t = parse_entry(path, name, value, data_len);
    if (name.size() > UINT32_MAX) throw refuse(path, name.substr(0, 64), "tensor name is too long");
    if (t.nbytes > 0) spans.push_back({t.offset, t.offset + t.nbytes, out.tensors.size()});
    t.offset += data_start;
    t.shard = shard;
    out.tensors.push_back({out.names.size(), static_cast<uint32_t>(name.size()), t});
    out.names.append(name);
  }
  std::sort(spans.begin(), spans.end(), [](const Span& a, const Span& b) { return a.start < b.start; });
  for (size_t i = 1; i < spans.size(); ++i) {
    if (spans[i].start < spans[i - 1].end) {
      const RawTensor& a = out.tensors[spans[i - 1].tensor];
      const RawTensor& b = out.tensors[spans[i].tensor];
      throw refuse(path, out.name(b),
                   fmt::format("data [{}, {}) overlaps tensor {} [{}, {})", spans[i].start, spans[i].end,
                               printable(out.name(a)), spans[i - 1].start, spans[i - 1].end));
    }
  }
}

struct ShardFile {
  fs::path path;
  File file;
};

// Shard file names: the index's weight_map values (deduplicated, sorted) or every *.safetensors.
// With an index, also returns tensor -> shard-file pairs for the cross-check after indexing.
std::vector<std::string> list_shards(const fs::path& dir, dom::parser& parser, dom::element& weight_map_out,
                                     bool& has_index) {
  std::vector<std::string> files;
  const fs::path index = dir / kIndexFile;
  std::error_code ec;
  has_index = fs::exists(index, ec);
  if (has_index) {
    const File f = File::open_read(index, File::Mode::buffered);
    simdjson::padded_string text(static_cast<size_t>(f.size()));
    f.read_exact(0, std::as_writable_bytes(std::span(text.data(), text.size())));
    dom::element doc;
    if (const auto err = parser.parse(text).get(doc)) {
      throw refuse_file(index, fmt::format("malformed JSON ({})", simdjson::error_message(err)));
    }
    // Keep the parsed document alive for the caller: the parser owns it, text is copied into it.
    dom::object map;
    if (doc["weight_map"].get(map)) throw refuse_file(index, "no \"weight_map\" object");
    std::map<std::string, std::string> first_tensor;  // shard file -> a tensor it should hold
    for (auto [tensor, shard] : map) {
      std::string_view s;
      if (shard.get(s)) throw refuse(index, tensor, "weight_map value is not a string");
      if (s.empty() || s.find('/') != s.npos || s == "." || s == "..") {
        throw refuse(index, tensor,
                     fmt::format("shard \"{}\" is not a file name in the model directory", printable(s)));
      }
      first_tensor.emplace(std::string(s), std::string(tensor));
    }
    if (first_tensor.empty()) throw refuse_file(index, "weight_map is empty");
    for (const auto& [shard, tensor] : first_tensor) {
      const fs::file_status st = fs::status(dir / shard, ec);
      if (!fs::is_regular_file(st)) {
        const char* what = !fs::exists(st)        ? "is missing"
                           : fs::is_directory(st) ? "is a directory, not a file"
                                                  : "is not a regular file";
        throw refuse(index, tensor, fmt::format("names shard {}, which {}", (dir / shard).string(), what));
      }
      files.push_back(shard);
    }
    weight_map_out = doc["weight_map"].value_unsafe();
  } else {
    if (!fs::is_directory(dir, ec)) throw refuse_file(dir, "not a directory");
    for (const fs::directory_entry& e : fs::directory_iterator(dir, ec)) {
      const std::string name = e.path().filename().string();
      if (name.size() <= 12 || !name.ends_with(".safetensors")) continue;
      // A shard that is a directory is named, not skipped (skipping it would report no shards).
      if (e.is_directory(ec)) throw refuse_file(e.path(), "is a directory, not a safetensors shard");
      if (e.is_regular_file(ec)) files.push_back(name);
    }
    if (ec) throw refuse_file(dir, fmt::format("cannot list: {}", ec.message()));
    if (files.empty()) throw refuse_file(dir, fmt::format("no *.safetensors files and no {}", kIndexFile));
    std::sort(files.begin(), files.end());
  }
  return files;
}

}  // namespace

struct ShardSet::Impl {
  std::vector<ShardFile> shards;
  TensorIndex index;

  const ShardFile& at(uint32_t shard) const;
  size_t heap_bytes() const {
    size_t b = sizeof(Impl) + shards.capacity() * sizeof(ShardFile) + index.heap_bytes();
    for (const ShardFile& s : shards) {
      // Path strings longer than the small-string buffer live on the heap (twice: ours and File's).
      for (const fs::path* p : {&s.path, &s.file.path()}) {
        if (p->native().capacity() > std::string().capacity()) b += p->native().capacity() + 1;
      }
    }
    return b;
  }
};

ShardSet::ShardSet() : impl_(new Impl) {}
ShardSet::ShardSet(ShardSet&& o) noexcept : impl_(std::exchange(o.impl_, nullptr)) {}
ShardSet& ShardSet::operator=(ShardSet&& o) noexcept {
  if (this != &o) {
    delete impl_;
    impl_ = std::exchange(o.impl_, nullptr);
  }
  return *this;
}
ShardSet::~ShardSet() {
  delete impl_;
}

ShardSet ShardSet::open(const fs::path& dir) {
  ShardSet set;
  Impl& im = *set.impl_;
  dom::parser index_parser;
  dom::element weight_map;
  bool has_index = false;
  const std::vector<std::string> files = list_shards(dir, index_parser, weight_map, has_index);

  Collector raw;
  dom::parser parser;
  im.shards.reserve(files.size());
  for (const std::string& name : files) {
    if (im.shards.size() >= UINT32_MAX) throw refuse_file(dir, "too many shards");
    const fs::path path = dir / name;
    im.shards.push_back({path, File::open_read(path, File::Mode::direct_preferred)});
    read_header(im.shards.back().file, static_cast<uint32_t>(im.shards.size() - 1), parser, raw);
  }
  // The parser's buffers are sized for the largest header; give them back before building.
  parser = dom::parser();

  std::vector<uint32_t> order(raw.tensors.size());
  for (uint32_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) {
    const std::string_view x = raw.name(raw.tensors[a]), y = raw.name(raw.tensors[b]);
    return x != y ? x < y : a < b;
  });
  TensorIndex::Builder builder;
  builder.reserve(order.size(), raw.names.size());
  for (size_t i = 0; i < order.size(); ++i) {
    const RawTensor& t = raw.tensors[order[i]];
    const std::string_view name = raw.name(t);
    if (i + 1 < order.size() && raw.name(raw.tensors[order[i + 1]]) == name) {
      const RawTensor& u = raw.tensors[order[i + 1]];
      const fs::path& a = im.shards[t.info.shard].path;
      const fs::path& b = im.shards[u.info.shard].path;
      if (t.info.shard == u.info.shard) throw refuse(a, name, "tensor name appears twice in the header");
      throw refuse(b, name, fmt::format("duplicate tensor name, also in {}", a.string()));
    }
    builder.add(name, t.info);
  }
  raw = Collector();
  order = {};
  im.index = builder.finish();

  if (has_index) {
    // The index must agree with the headers: every tensor it lists is in the shard it names.
    const fs::path index_path = dir / kIndexFile;
    std::vector<std::string> file_names;  // once per shard, not once per tensor
    file_names.reserve(im.shards.size());
    for (const ShardFile& s : im.shards) file_names.push_back(s.path.filename().string());
    for (auto [tensor, shard] : dom::object(weight_map)) {
      const auto t = im.index.find(tensor);
      const std::string_view file = std::string_view(shard);
      if (!t)
        throw refuse(index_path, tensor, fmt::format("listed in {} but in no shard header", printable(file)));
      if (file_names[t->shard] != file) {
        throw refuse(
            index_path, tensor,
            fmt::format("listed in {} but found in {}", printable(file), im.shards[t->shard].path.string()));
      }
    }
  }
  return set;
}

std::optional<TensorInfo> ShardSet::find(std::string_view name) const {
  return impl_->index.find(name);
}
size_t ShardSet::tensor_count() const {
  return impl_->index.size();
}
size_t ShardSet::shard_count() const {
  return impl_->shards.size();
}
const ShardFile& ShardSet::Impl::at(uint32_t shard) const {
  if (shard >= shards.size()) {
    throw usage_error(fmt::format("shard {} of a set of {}", shard, shards.size()));
  }
  return shards[shard];
}
const fs::path& ShardSet::shard_path(uint32_t shard) const {
  return impl_->at(shard).path;
}
uint64_t ShardSet::shard_size(uint32_t shard) const {
  return impl_->at(shard).file.size();
}
const File& ShardSet::shard_file(uint32_t shard) const {
  return impl_->at(shard).file;
}
void ShardSet::for_each(const std::function<void(std::string_view, const TensorInfo&)>& fn) const {
  impl_->index.for_each(fn);
}
size_t ShardSet::index_bytes() const {
  return impl_->heap_bytes();
}

void ShardSet::read(const TensorInfo& t, std::span<std::byte> dst) const {
  if (dst.size() != t.nbytes) {
    throw usage_error(fmt::format("{}: tensor at offset {} is {} bytes, the destination {}",
                                  t.shard < impl_->shards.size() ? impl_->shards[t.shard].path.string() : "?",
                                  t.offset, t.nbytes, dst.size()));
  }
  read_range(t.shard, t.offset, dst);
}

void ShardSet::read_range(uint32_t shard, uint64_t offset, std::span<std::byte> dst) const {
  const ShardFile& s = impl_->at(shard);
  if (offset > s.file.size() || dst.size() > s.file.size() - offset) {
    throw runtime_error(fmt::format("{}: range [{}, +{}) lies past the end of the file ({} bytes)",
                                    s.path.string(), offset, dst.size(), s.file.size()));
  }
  s.file.read_exact(offset, dst);
}

}  // namespace k3::io
