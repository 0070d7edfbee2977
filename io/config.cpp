// config.json reader (docs/model.md §1). Parsing rules follow the Rust reference where the two references
// differ (§1.2): ints and full_attn_layers entries must be JSON integer literals; bools take
// true/false or an integer literal, anything else keeps the default.
#include "io/config.hpp"

#include <fmt/format.h>
#include <simdjson.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <fstream>
#include <sstream>

#include "io/error.hpp"

namespace k3::io {

namespace dom = simdjson::dom;

namespace {

Error cfg_error(const std::string& source, const std::string& what) {
  return runtime_error(fmt::format("{}: {}", source, what));
}

enum class Kind { integer, real, boolean, layer_list };

struct Field {
  const char* key;
  const char* alias;  // nullptr when none
  Kind kind;
  int ModelConfig::*i = nullptr;
  float ModelConfig::*f = nullptr;
  bool ModelConfig::*b = nullptr;
};

constexpr Field I(const char* k, const char* a, int ModelConfig::*m) {
  return {k, a, Kind::integer, m};
}
constexpr Field F(const char* k, const char* a, float ModelConfig::*m) {
  return {k, a, Kind::real, nullptr, m};
}
constexpr Field B(const char* k, bool ModelConfig::*m) {
  return {k, nullptr, Kind::boolean, nullptr, nullptr, m};
}

// Every field of docs/model.md §1.2, in the order the missing-field report lists them.
const Field kFields[] = {
    I("hidden_size", nullptr, &ModelConfig::hidden),
    I("num_hidden_layers", nullptr, &ModelConfig::n_layers),
    I("vocab_size", nullptr, &ModelConfig::vocab),
    F("rms_norm_eps", nullptr, &ModelConfig::rms_eps),
    I("num_heads", "kda_num_heads", &ModelConfig::kda_heads),
    I("head_dim", "kda_head_dim", &ModelConfig::kda_head_dim),
    I("short_conv_kernel_size", nullptr, &ModelConfig::conv_kernel),
    F("gate_lower_bound", nullptr, &ModelConfig::gate_lower_bound),
    I("num_attention_heads", nullptr, &ModelConfig::mla_heads),
    I("q_lora_rank", nullptr, &ModelConfig::q_lora_rank),
    I("kv_lora_rank", nullptr, &ModelConfig::kv_lora_rank),
    I("qk_nope_head_dim", nullptr, &ModelConfig::qk_nope),
    I("qk_rope_head_dim", nullptr, &ModelConfig::qk_rope),
    I("v_head_dim", nullptr, &ModelConfig::v_head),
    B("mla_use_output_gate", &ModelConfig::mla_out_gate),
    I("num_experts", nullptr, &ModelConfig::n_experts),
    I("num_experts_per_token", nullptr, &ModelConfig::top_k),
    I("num_shared_experts", nullptr, &ModelConfig::n_shared),
    I("routed_expert_hidden_size", nullptr, &ModelConfig::latent),
    I("moe_intermediate_size", nullptr, &ModelConfig::moe_inter),
    F("routed_scaling_factor", nullptr, &ModelConfig::routed_scale),
    B("moe_renormalize", &ModelConfig::moe_renormalize),
    B("latent_moe_use_norm", &ModelConfig::latent_norm),
    I("first_k_dense_replace", nullptr, &ModelConfig::first_dense),
    I("intermediate_size", nullptr, &ModelConfig::dense_inter),
    I("attn_res_block_size", nullptr, &ModelConfig::attn_res_block),
    F("activation_situ_beta", "situ_beta", &ModelConfig::situ_beta),
    F("activation_situ_linear_beta", "situ_linear_beta", &ModelConfig::situ_linear_beta),
    {"full_attn_layers", nullptr, Kind::layer_list},
};

// Candidate objects in lookup order (§1.1): text_config, linear_attn_config, root.
struct Lookup {
  std::vector<dom::object> objects;

  bool find(const char* key, const char* alias, dom::element& out) const {
    for (const dom::object& o : objects) {
      if (o.at_key(key).get(out) == simdjson::SUCCESS) return true;
      if (alias && o.at_key(alias).get(out) == simdjson::SUCCESS) return true;
    }
    return false;
  }
};

bool member_object(const dom::object& parent, const char* key, dom::object& out, const std::string& source) {
  dom::element e;
  if (parent.at_key(key).get(e) != simdjson::SUCCESS) return false;
  if (e.get(out) != simdjson::SUCCESS) throw cfg_error(source, fmt::format("`{}` is not an object", key));
  return true;
}

std::string number_text(const dom::element& e) {
  std::ostringstream os;
  os << e;
  return os.str();
}

// Upper bounds, far above the released model (hidden 7168, 93 layers, vocab 163840, 96 heads of
// 128, 896 experts of 3072 x 3584, dense 33792) yet low enough that every size the engine derives
// from them -- int sums like qk_nope + qk_rope, moe_intermediate_size x num_shared_experts, tensor
// element counts and byte offsets in uint64 -- cannot overflow. A corrupt or hostile config is
// refused here, naming the field, instead of overflowing or asking for terabytes later.
struct Limit {
  const char* key;
  int ModelConfig::*field;
  int max;
};
constexpr Limit kLimits[] = {
    {"hidden_size", &ModelConfig::hidden, 1 << 16},
    {"num_hidden_layers", &ModelConfig::n_layers, 1 << 10},
    {"vocab_size", &ModelConfig::vocab, 1 << 24},
    {"num_heads", &ModelConfig::kda_heads, 1 << 10},
    {"head_dim", &ModelConfig::kda_head_dim, 1 << 12},
    {"short_conv_kernel_size", &ModelConfig::conv_kernel, 1 << 8},
    {"num_attention_heads", &ModelConfig::mla_heads, 1 << 10},
    {"q_lora_rank", &ModelConfig::q_lora_rank, 1 << 16},
    {"kv_lora_rank", &ModelConfig::kv_lora_rank, 1 << 16},
    {"qk_nope_head_dim", &ModelConfig::qk_nope, 1 << 12},
    {"qk_rope_head_dim", &ModelConfig::qk_rope, 1 << 12},
    {"v_head_dim", &ModelConfig::v_head, 1 << 12},
    {"num_experts", &ModelConfig::n_experts, 1 << 16},
    {"num_shared_experts", &ModelConfig::n_shared, 1 << 8},
    {"routed_expert_hidden_size", &ModelConfig::latent, 1 << 16},
    {"moe_intermediate_size", &ModelConfig::moe_inter, 1 << 18},
    {"intermediate_size", &ModelConfig::dense_inter, 1 << 20},
    {"attn_res_block_size", &ModelConfig::attn_res_block, 1 << 10},
};

// The field limits alone keep most tensors below 2^40 elements (vocab x hidden is at most 2^40,
// ~1000x the released model's largest); the products below are the ones they do not bound. The
// routed experts of all layers together may hold 2^50 weights (~400x the released model's).
constexpr uint64_t kMaxTensorElements = uint64_t{1} << 40;
constexpr uint64_t kMaxExpertElements = uint64_t{1} << 50;

void check_limits(const ModelConfig& c, const std::string& source) {
  for (const Limit& l : kLimits) {
    if (c.*(l.field) > l.max)
      throw cfg_error(source, fmt::format("{} = {} exceeds the limit {}", l.key, c.*(l.field), l.max));
  }
  auto u = [](int v) { return static_cast<uint64_t>(v); };
  struct Product {
    const char* what;
    uint64_t value;
    uint64_t max;
  };
  // Within the field limits neither product can wrap (the larger is at most 2^60).
  const Product products[] = {
      {"num_shared_experts x moe_intermediate_size x hidden_size",
       u(c.n_shared) * u(c.moe_inter) * u(c.hidden), kMaxTensorElements},
      {"num_hidden_layers x num_experts x moe_intermediate_size x routed_expert_hidden_size",
       u(c.n_layers) * u(c.n_experts) * u(c.moe_inter) * u(c.latent), kMaxExpertElements},
  };
  for (const Product& p : products) {
    if (p.value > p.max)
      throw cfg_error(source, fmt::format("{} = {} exceeds the limit {}", p.what, p.value, p.max));
  }
  // The epsilon is used as an f32: 1e300 becomes inf there and every norm then outputs zeros,
  // which decodes "successfully" to id 0 forever.
  if (!(c.rms_eps > 0.0f && c.rms_eps < 1.0f))
    throw cfg_error(source, fmt::format("rms_norm_eps = {} is not in (0, 1) as a float32", c.rms_eps));
}

// The document's top-level object, or the object under its "config" key when it has one.
dom::object config_root(dom::parser& parser, const simdjson::padded_string& text, const std::string& source) {
  dom::element doc;
  if (auto err = parser.parse(text).get(doc)) {
    throw cfg_error(source, fmt::format("not valid JSON ({})", simdjson::error_message(err)));
  }
  dom::object root;
  if (doc.get(root) != simdjson::SUCCESS) throw cfg_error(source, "top level is not a JSON object");
  dom::object wrapped;
  if (member_object(root, "config", wrapped, source)) root = wrapped;
  return root;
}

// The objects a field is looked up in, in order (§1.1); sets cfg.nested when there is a text_config.
Lookup field_lookup(const dom::object& root, ModelConfig& cfg, const std::string& source) {
  Lookup lookup;
  dom::object text_config, linear;
  cfg.nested = member_object(root, "text_config", text_config, source);
  if (cfg.nested) lookup.objects.push_back(text_config);
  if ((cfg.nested && member_object(text_config, "linear_attn_config", linear, source)) ||
      member_object(root, "linear_attn_config", linear, source)) {
    lookup.objects.push_back(linear);
  }
  lookup.objects.push_back(root);
  return lookup;
}

// The readers of one kFields entry by its kind. `e` is the field's value, null when absent; a
// required field that is absent or not of its kind is added to `missing` (reported together).

void read_integer(const Field& f, const dom::element* e, ModelConfig& cfg, std::vector<std::string>& missing,
                  const std::string& source) {
  if (!e) {
    missing.emplace_back(f.key);
  } else if (e->type() == dom::element_type::INT64) {
    const auto v = int64_t(*e);
    if (v < INT_MIN || v > INT_MAX) {
      throw cfg_error(source, fmt::format("{} = {} does not fit a 32-bit int", f.key, v));
    }
    cfg.*(f.i) = static_cast<int>(v);
  } else if (e->type() == dom::element_type::UINT64) {
    throw cfg_error(source, fmt::format("{} = {} does not fit a 32-bit int", f.key, number_text(*e)));
  } else {
    // A number with a fraction or exponent (e.g. 4.0) is not an integer: counted as missing.
    missing.push_back(fmt::format("{} (not an integer: {})", f.key, number_text(*e)));
  }
}

void read_real(const Field& f, const dom::element* e, ModelConfig& cfg, std::vector<std::string>& missing) {
  if (!e) {
    missing.emplace_back(f.key);
  } else if (e->is_number()) {
    cfg.*(f.f) = static_cast<float>(double(*e));
  } else {
    missing.push_back(fmt::format("{} (not a number)", f.key));
  }
}

// Optional (the default is true): anything but a bool or an integer keeps the default.
void read_boolean(const Field& f, const dom::element* e, ModelConfig& cfg) {
  if (!e) return;
  if (e->type() == dom::element_type::BOOL) {
    cfg.*(f.b) = bool(*e);
  } else if (e->type() == dom::element_type::INT64) {
    cfg.*(f.b) = int64_t(*e) != 0;
  } else if (e->type() == dom::element_type::UINT64) {
    cfg.*(f.b) = true;
  }
}

// full_attn_layers: its entries appended to `layers` as written (ONE-based; checked later).
void read_layer_list(const Field& f, const dom::element* e, std::vector<int64_t>& layers,
                     std::vector<std::string>& missing, const std::string& source) {
  dom::array arr;
  if (!e) {
    missing.emplace_back(f.key);
  } else if (e->get(arr) != simdjson::SUCCESS) {
    missing.push_back(fmt::format("{} (not an array)", f.key));
  } else if (arr.size() == 0) {
    missing.push_back(fmt::format("{} (empty)", f.key));
  } else {
    // Entry errors end the load at once, before the missing-field report (§1.2).
    size_t i = 0;
    for (dom::element v : arr) {
      if (v.type() == dom::element_type::INT64) {
        layers.push_back(int64_t(v));
      } else if (v.type() == dom::element_type::UINT64) {
        layers.push_back(INT64_MAX);  // out of 1..n_layers by construction
      } else {
        throw cfg_error(source, fmt::format("full_attn_layers[{}] is not a number", i));
      }
      ++i;
    }
  }
}

// Every field of kFields, in its order, into `cfg` (full_attn_layers into `layers`); returns the
// required fields that are absent or not of their kind.
std::vector<std::string> read_fields(const Lookup& lookup, ModelConfig& cfg, std::vector<int64_t>& layers,
                                     const std::string& source) {
  std::vector<std::string> missing;
  for (const Field& f : kFields) {
    dom::element found;
    const dom::element* e = lookup.find(f.key, f.alias, found) ? &found : nullptr;
    switch (f.kind) {
      case Kind::integer:
        read_integer(f, e, cfg, missing, source);
        break;
      case Kind::real:
        read_real(f, e, cfg, missing);
        break;
      case Kind::boolean:
        read_boolean(f, e, cfg);
        break;
      case Kind::layer_list:
        read_layer_list(f, e, layers, missing, source);
        break;
    }
  }
  return missing;
}

void refuse_missing(const std::vector<std::string>& missing, const std::string& source) {
  if (missing.empty()) return;
  std::string names;
  for (const std::string& m : missing) names += (names.empty() ? "" : ", ") + m;
  throw runtime_error(
      fmt::format("{} is missing {} required field(s): {} -- refusing to substitute defaults: a config "
                  "this reader cannot fully understand would silently produce a DIFFERENT model.",
                  source, missing.size(), names));
}

// Structural refusals of docs/model.md §1.3, in the references' order.
void check_structure(const ModelConfig& cfg, const std::vector<int64_t>& layers, const std::string& source) {
  if (cfg.n_layers <= 0 || cfg.hidden <= 0 || cfg.vocab <= 0) {
    throw cfg_error(source, fmt::format("has non-positive layers/hidden/vocab (layers={} hidden={} vocab={})",
                                        cfg.n_layers, cfg.hidden, cfg.vocab));
  }
  if (layers.size() >= static_cast<size_t>(cfg.n_layers)) {
    throw cfg_error(source,
                    fmt::format("full_attn_layers marks {} of {} layers as full attention, leaving no "
                                "KDA layers",
                                layers.size(), cfg.n_layers));
  }
  for (size_t i = 0; i < layers.size(); ++i) {
    if (layers[i] < 1 || layers[i] > cfg.n_layers) {
      const std::string v = layers[i] == INT64_MAX ? std::string("(too large)") : std::to_string(layers[i]);
      throw cfg_error(source,
                      fmt::format("full_attn_layers[{}] = {} is outside 1..{} (the list is ONE-based: "
                                  "layer l is full attention iff l+1 is listed)",
                                  i, v, cfg.n_layers));
    }
  }
  if (cfg.top_k > kMaxTopK) {
    throw cfg_error(source,
                    fmt::format("num_experts_per_token selects top-{}, but this build supports at most {} "
                                "(hint: raise k3::io::kMaxTopK and rebuild)",
                                cfg.top_k, kMaxTopK));
  }
  if (cfg.top_k > cfg.n_experts) {
    throw cfg_error(source,
                    fmt::format("num_experts_per_token selects {} of {} experts", cfg.top_k, cfg.n_experts));
  }
  if (cfg.attn_res_block <= 0) {
    throw cfg_error(source, fmt::format("attn_res_block_size = {} must be positive (AttnRes block boundaries "
                                        "divide by it)",
                                        cfg.attn_res_block));
  }
  if (cfg.conv_kernel < 1) {
    throw cfg_error(source, fmt::format("short_conv_kernel_size = {} must be at least 1", cfg.conv_kernel));
  }
}

// Stricter than both references (they accept these and fail later, or index out of bounds):
// sizes the engine allocates or divides by must be positive.
void check_sizes(const ModelConfig& cfg, const std::string& source) {
  struct Positive {
    const char* key;
    int value;
    int min;
  };
  const Positive sizes[] = {
      {"num_experts_per_token", cfg.top_k, 1},
      {"num_experts", cfg.n_experts, 1},
      {"num_heads", cfg.kda_heads, 1},
      {"head_dim", cfg.kda_head_dim, 1},
      {"num_attention_heads", cfg.mla_heads, 1},
      {"q_lora_rank", cfg.q_lora_rank, 1},
      {"kv_lora_rank", cfg.kv_lora_rank, 1},
      {"qk_nope_head_dim", cfg.qk_nope, 1},
      {"qk_rope_head_dim", cfg.qk_rope, 0},
      {"v_head_dim", cfg.v_head, 1},
      {"num_shared_experts", cfg.n_shared, 0},
      {"routed_expert_hidden_size", cfg.latent, 1},
      {"moe_intermediate_size", cfg.moe_inter, 1},
      {"first_k_dense_replace", cfg.first_dense, 0},
  };
  for (const Positive& p : sizes) {
    if (p.value < p.min) {
      throw cfg_error(source, fmt::format("{} = {} must be at least {}", p.key, p.value, p.min));
    }
  }
  if (cfg.dense_inter < 0) {
    throw cfg_error(source, fmt::format("intermediate_size = {} must be at least 0", cfg.dense_inter));
  }
}

// The dense layers below first_k_dense_replace: within the model, and with a dense FFN to run.
void check_dense_layers(const ModelConfig& cfg, const std::string& source) {
  if (cfg.first_dense > cfg.n_layers) {
    throw cfg_error(source, fmt::format("first_k_dense_replace = {} exceeds num_hidden_layers = {}",
                                        cfg.first_dense, cfg.n_layers));
  }
  if (cfg.first_dense > 0 && cfg.dense_inter < 1) {
    throw cfg_error(source, fmt::format("intermediate_size = {} must be at least 1 (layers below "
                                        "first_k_dense_replace = {} are dense)",
                                        cfg.dense_inter, cfg.first_dense));
  }
}

}  // namespace

bool ModelConfig::is_mla(int l) const {
  return std::find(full_attn_layers.begin(), full_attn_layers.end(), l + 1) != full_attn_layers.end();
}

LayerKind ModelConfig::layer(int l) const {
  return LayerKind{is_mla(l) ? LayerAttention::mla : LayerAttention::kda,
                   is_dense(l) ? LayerFfn::dense : LayerFfn::moe,
                   attn_res_block > 0 && l % attn_res_block == 0};
}

int ModelConfig::mla_layer_count() const {
  return static_cast<int>(full_attn_layers.size());
}

std::string ModelConfig::summary() const {
  return fmt::format(
      "config: {} ({} shape) | hidden={} layers={} vocab={} | {} MLA + {} KDA | experts {} top{} "
      "shared{} | latent={}",
      source, nested ? "nested" : "flat", hidden, n_layers, vocab, mla_layer_count(), kda_layer_count(),
      n_experts, top_k, n_shared, latent);
}

ModelConfig parse_config(std::string_view json, const std::string& source) {
  dom::parser parser;  // owns the parsed document every dom::object below points into
  simdjson::padded_string text(json);
  ModelConfig cfg;
  cfg.source = source;
  const Lookup lookup = field_lookup(config_root(parser, text, source), cfg, source);
  std::vector<int64_t> layers;  // full_attn_layers as written, checked against n_layers below
  refuse_missing(read_fields(lookup, cfg, layers, source), source);
  check_structure(cfg, layers, source);
  check_sizes(cfg, source);
  check_limits(cfg, source);
  check_dense_layers(cfg, source);
  cfg.full_attn_layers.assign(layers.begin(), layers.end());
  return cfg;
}

ModelConfig load_config(const std::filesystem::path& path) {
  namespace fs = std::filesystem;
  fs::path file = path;
  std::error_code ec;
  // A model directory holds config.json; a directory that is itself named config.json (or one
  // whose config.json is a directory) is refused by name rather than searched for a config inside.
  if (fs::is_directory(file, ec) &&
      (file.filename() != "config.json" || fs::exists(file / "config.json", ec)))
    file /= "config.json";
  if (fs::is_directory(file, ec)) throw runtime_error(fmt::format("{} is a directory", file.string()));
  std::ifstream in(file, std::ios::binary);
  if (!in) throw cfg_error(file.string(), fmt::format("cannot open ({})", std::strerror(errno)));
  std::ostringstream buf;
  buf << in.rdbuf();
  if (in.bad()) throw cfg_error(file.string(), "read failed");
  return parse_config(buf.str(), file.string());
}

}  // namespace k3::io
