#include "pipeline/serve/api_sampling.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "io/error.hpp"
#include "io/text/utf8.hpp"
#include "pipeline/serve/api_json.hpp"
#include "stages/json_schema.hpp"

namespace k3::pipeline::serve {

namespace dom = simdjson::dom;

namespace {

double penalty(dom::object o, std::string_view key) {
  const auto e = member(o, key);
  if (!e) return 0;
  const double v = as_number(*e, key);
  if (!(v >= -2 && v <= 2)) throw bad(fmt::format("'{}' must be in [-2, 2]", key));
  return v;
}

std::shared_ptr<const stages::JsonSchema> response_format(dom::element e) {
  dom::object rf;
  if (e.get(rf)) throw bad("'response_format' must be an object");
  const auto type = member(rf, "type");
  if (!type) throw bad("'response_format.type' is required");
  const std::string t = as_string(*type, "response_format.type");
  for (auto [key, value] : rf)
    if (key != "type" && !(t == "json_schema" && key == "json_schema"))
      throw bad(fmt::format("'response_format.{}' is not supported with type {}", key, t));
  if (t == "text") return nullptr;
  if (t == "json_object") return std::make_shared<stages::JsonSchema>(stages::json_object_schema());
  if (t != "json_schema")
    throw bad(fmt::format("'response_format.type' {}: text, json_object or json_schema", t));
  const auto js = member(rf, "json_schema");
  dom::object jo;
  if (!js || js->get(jo)) throw bad("'response_format.json_schema' must be an object");
  for (auto [key, value] : jo) {
    if (key == "name") {
      as_string(value, "response_format.json_schema.name");
    } else if (key == "description") {
      as_string(value, "response_format.json_schema.description");
    } else if (key == "strict") {
      // Constrained sampling always follows the schema: strict or not, the output matches it.
      as_bool(value, "response_format.json_schema.strict");
    } else if (key != "schema") {
      throw bad(fmt::format("'response_format.json_schema.{}' is not supported", key));
    }
  }
  const auto schema = member(jo, "schema");
  if (!schema) throw bad("'response_format.json_schema.schema' is required");
  try {
    return std::make_shared<stages::JsonSchema>(
        stages::compile_json_schema(simdjson::minify(*schema), "'response_format.json_schema.schema'"));
  } catch (const io::Error& err) {
    throw bad(err.what());
  }
}

void write_token(io::JsonWriter& w, const std::string& bytes, double logprob) {
  // A token may hold part of a UTF-8 character: the text shows U+FFFD there, `bytes` is exact.
  w.field("token", io::text::replace_invalid_utf8(bytes));
  w.field("logprob", std::max(logprob, kLogprobFloor));
  w.key("bytes").begin_array();
  for (char c : bytes) w.value(int(uint8_t(c)));
  w.end_array();
}

}  // namespace

void parse_sampling_fields(dom::object o, Endpoint ep, ApiRequest& r) {
  GenRequest& g = r.gen;
  g.sampling.presence_penalty = penalty(o, "presence_penalty");
  g.sampling.frequency_penalty = penalty(o, "frequency_penalty");
  if (ep == Endpoint::chat) {
    const auto lp = member(o, "logprobs");
    const bool on = lp && as_bool(*lp, "logprobs");
    if (auto tl = member(o, "top_logprobs")) {
      const int64_t n = as_integer(*tl, "top_logprobs");
      if (n < 0 || n > kMaxTopLogprobs)
        throw bad(fmt::format("'top_logprobs' must be in [0, {}]", kMaxTopLogprobs));
      if (!on) throw bad("'top_logprobs' needs 'logprobs': true");
      g.logprobs = int(n);
    } else if (on) {
      g.logprobs = 0;
    }
  } else if (auto lp = member(o, "logprobs")) {
    const int64_t n = as_integer(*lp, "logprobs");
    if (n < 0 || n > kMaxTopLogprobs)
      throw bad(fmt::format("'logprobs' must be in [0, {}]", kMaxTopLogprobs));
    g.logprobs = int(n);
  }
  if (auto rf = member(o, "response_format")) g.json = response_format(*rf);
  if (g.json && g.ignore_eos) throw bad("'ignore_eos' and a JSON 'response_format' exclude each other");
}

void write_logprobs(io::JsonWriter& w, Endpoint ep, std::span<const TokenLogprobs> tokens,
                    size_t& text_offset) {
  w.begin_object();
  if (ep == Endpoint::chat) {
    w.key("content").begin_array();
    for (const TokenLogprobs& t : tokens) {
      w.begin_object();
      write_token(w, t.bytes, t.logprob);
      w.key("top_logprobs").begin_array();
      for (const auto& [bytes, lp] : t.top) {
        w.begin_object();
        write_token(w, bytes, lp);
        w.end_object();
      }
      w.end_array().end_object();
    }
    w.end_array();
    w.key("refusal").value(nullptr);
  } else {
    w.key("tokens").begin_array();
    for (const TokenLogprobs& t : tokens) w.value(io::text::replace_invalid_utf8(t.bytes));
    w.end_array().key("token_logprobs").begin_array();
    for (const TokenLogprobs& t : tokens) w.value(std::max(t.logprob, kLogprobFloor));
    w.end_array().key("top_logprobs").begin_array();
    for (const TokenLogprobs& t : tokens) {
      w.begin_object();
      for (const auto& [bytes, lp] : t.top)
        w.field(io::text::replace_invalid_utf8(bytes), std::max(lp, kLogprobFloor));
      w.end_object();
    }
    w.end_array().key("text_offset").begin_array();
    for (const TokenLogprobs& t : tokens) {
      w.value(text_offset);
      text_offset += t.bytes.size();
    }
    w.end_array();
  }
  w.end_object();
}

}  // namespace k3::pipeline::serve
