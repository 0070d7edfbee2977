#include "io/text/xtml_tools.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <initializer_list>
#include <string>

#include "io/error.hpp"
#include "io/json_text.hpp"

namespace k3::io::text {

namespace dom = simdjson::dom;
using Role = ChatMessage::Role;

namespace {

std::string py_float(double d) {
  std::string s = fmt::format("{}", d);
  // fmt's shortest form already switches to exponents where Python's repr does; it writes an
  // integral value without a fraction, which Python's float repr never does.
  if (s.find_first_of(".enI") == std::string::npos) s += ".0";
  return s;
}

void write(dom::element e, const PyJsonStyle& st, std::string& out) {
  const char* comma = st.compact ? "," : ", ";
  const char* colon = st.compact ? ":" : ": ";
  switch (e.type()) {
    case dom::element_type::OBJECT: {
      std::vector<std::pair<std::string_view, dom::element>> members;
      for (dom::key_value_pair kv : dom::object(e)) members.emplace_back(kv.key, kv.value);
      if (st.sort_keys)
        std::stable_sort(members.begin(), members.end(),
                         [](const auto& a, const auto& b) { return a.first < b.first; });
      out += '{';
      for (size_t i = 0; i < members.size(); ++i) {
        if (i) out += comma;
        out += json_quote(members[i].first);
        out += colon;
        write(members[i].second, st, out);
      }
      out += '}';
      return;
    }
    case dom::element_type::ARRAY: {
      out += '[';
      bool first = true;
      for (dom::element v : dom::array(e)) {
        if (!first) out += comma;
        first = false;
        write(v, st, out);
      }
      out += ']';
      return;
    }
    case dom::element_type::STRING:
      out += json_quote(std::string_view(e));
      return;
    case dom::element_type::INT64:
      out += fmt::format("{}", int64_t(e));
      return;
    case dom::element_type::UINT64:
      out += fmt::format("{}", uint64_t(e));
      return;
    case dom::element_type::DOUBLE:
      out += py_float(double(e));
      return;
    case dom::element_type::BOOL:
      out += bool(e) ? "true" : "false";
      return;
    case dom::element_type::NULL_VALUE:
      out += "null";
      return;
  }
}

}  // namespace

std::string py_json(dom::element e, PyJsonStyle st) {
  std::string out;
  write(e, st, out);
  return out;
}

bool py_json_text(std::string_view text, PyJsonStyle st, std::string& out) {
  dom::parser parser;
  dom::element doc;
  if (parser.parse(text.data(), text.size()).get(doc)) return false;
  out = py_json(doc, st);
  return true;
}

std::string escape_attr(std::string_view v) {
  std::string out;
  for (char c : v) {
    if (c == '&')
      out += "&amp;";
    else if (c == '"')
      out += "&quot;";
    else
      out += c;
  }
  return out;
}

// Attributes of a tag header (` key="value"` pairs), unescaped; nullopt when the header is not
// made of such pairs.
std::optional<AttrList> parse_attrs(std::string_view h) {
  AttrList out;
  size_t i = 0;
  while (i < h.size()) {
    if (h[i] != ' ') return std::nullopt;
    ++i;
    const size_t eq = h.find("=\"", i);
    if (eq == std::string_view::npos || eq == i) return std::nullopt;
    const size_t end = h.find('"', eq + 2);
    if (end == std::string_view::npos) return std::nullopt;
    std::string v(h.substr(eq + 2, end - eq - 2));
    for (auto [from, to] : {std::pair{"&quot;", "\""}, std::pair{"&amp;", "&"}}) {
      for (size_t at = v.find(from); at != std::string::npos; at = v.find(from, at + 1))
        v.replace(at, std::string_view(from).size(), to);
    }
    out.emplace_back(std::string(h.substr(i, eq - i)), std::move(v));
    i = end + 1;
  }
  return out;
}

namespace {
std::optional<std::string> attr(const AttrList& attrs, std::string_view key) {
  for (const auto& [k, v] : attrs)
    if (k == key) return v;
  return std::nullopt;
}
}  // namespace

// One complete call: `<|open|>call ATTRS<|sep|>BODY` (the closing already cut off) to its name and
// arguments as a compact JSON object. A typed argument's value is a JSON string when its type is
// string (or its text is not valid JSON), its text otherwise; a json block is the arguments
// verbatim. The reason on failure.
std::variant<ToolCall, std::string> parse_call(std::string_view text) {
  namespace dom = simdjson::dom;
  const size_t sep = text.find(kSep);
  if (sep == std::string_view::npos) return std::string("a tool call header without <|sep|>");
  const auto attrs = parse_attrs(text.substr(kCallOpen.size(), sep - kCallOpen.size()));
  if (!attrs) return std::string("a tool call header that is not key=\"value\" attributes");
  const std::optional<std::string> name = attr(*attrs, "tool");
  if (!name || name->empty()) return std::string("a tool call without a tool attribute");
  ToolCall call{{}, *name, {}};
  std::string_view body = text.substr(sep + kSep.size());
  const auto block =
      [&](std::string_view tag) -> std::optional<std::pair<std::string_view, std::string_view>> {
    const std::string open = fmt::format("{}{}", kOpen, tag);
    const std::string close = fmt::format("{}{}{}", kClose, tag, kSep);
    if (!body.starts_with(open)) return std::nullopt;
    const size_t hs = body.find(kSep);
    const size_t ce = body.find(close);
    if (hs == std::string_view::npos || ce == std::string_view::npos || ce < hs) return std::nullopt;
    auto r = std::pair{body.substr(open.size(), hs - open.size()),
                       body.substr(hs + kSep.size(), ce - hs - kSep.size())};
    body.remove_prefix(ce + close.size());
    return r;
  };
  if (auto j = block("json")) {
    if (!body.empty()) return std::string("text after the json block of a tool call");
    call.arguments = std::string(j->second);
    return call;
  }
  std::string json = "{";
  dom::parser parser;
  while (!body.empty()) {
    const auto a = block("argument");
    if (!a) return std::string("a tool call body that is not argument blocks");
    const auto aa = parse_attrs(a->first);
    const std::optional<std::string> key = aa ? attr(*aa, "key") : std::nullopt;
    if (!key) return std::string("an argument without a key attribute");
    const std::string type = aa ? attr(*aa, "type").value_or("string") : "string";
    if (json.size() > 1) json += ',';
    json += json_quote(*key);
    json += ':';
    dom::element v;
    if (type != "string" && !parser.parse(a->second.data(), a->second.size()).get(v))
      json += py_json(v, PyJsonStyle{.compact = true, .sort_keys = false});
    else
      json += json_quote(a->second);
  }
  call.arguments = json + "}";
  return call;
}

RenderedArguments render_arguments(const ToolCall& call) {
  RenderedArguments out;
  const std::string_view args = call.arguments;
  if (args.find_first_not_of(" \t\r\n") == std::string_view::npos) return out;
  dom::parser parser;
  dom::element doc;
  if (parser.parse(args.data(), args.size()).get(doc)) {
    out.json_block = std::string(args);
    return out;
  }
  dom::object obj;
  if (doc.get(obj))
    throw usage_error(fmt::format("chat: the arguments of tool call '{}' must be a JSON object", call.name));
  for (dom::key_value_pair kv : obj) {
    const char* type = "array";
    switch (kv.value.type()) {
      case dom::element_type::BOOL:
        type = "boolean";
        break;
      case dom::element_type::NULL_VALUE:
        type = "null";
        break;
      case dom::element_type::INT64:
      case dom::element_type::UINT64:
      case dom::element_type::DOUBLE:
        type = "number";
        break;
      case dom::element_type::STRING:
        type = "string";
        break;
      case dom::element_type::OBJECT:
        type = "object";
        break;
      case dom::element_type::ARRAY:
        break;
    }
    out.blocks.push_back(ArgumentBlock{
        std::string(kv.key), type,
        kv.value.is_string() ? std::string(std::string_view(kv.value))
                             : py_json(kv.value, PyJsonStyle{.compact = false, .sort_keys = false})});
  }
  return out;
}

std::string tools_body(std::string_view tools) {
  std::string json;
  if (!py_json_text(tools, PyJsonStyle{.compact = true, .sort_keys = true}, json))
    throw usage_error("chat: the tool declarations are not valid JSON");
  return fmt::format("# Tools\nHere are the available tools, described in JSONSchema.\n\n```json\n{}\n```",
                     json);
}

std::string tool_choice_body(const ToolChoice& c) {
  using K = ToolChoice::Kind;
  if (c.kind == K::none)
    return "The system is invoked with `tool_choice=none`.\nYou MUST NOT call any tools in the next message.";
  if (c.kind == K::required || c.kind == K::named)
    return "The system is invoked with `tool_choice=required`.\nYou MUST call tools in the next message.";
  return {};
}

std::vector<ToolSlot> order_tool_results(std::span<const ChatMessage> msgs) {
  std::vector<ToolSlot> order;
  const std::vector<ToolCall>* calls = nullptr;
  for (size_t i = 0; i < msgs.size();) {
    if (msgs[i].role == Role::assistant) calls = &msgs[i].tool_calls;
    if (msgs[i].role != Role::tool) {
      order.push_back({i, {}});
      ++i;
      continue;
    }
    size_t end = i;
    while (end < msgs.size() && msgs[end].role == Role::tool) ++end;
    std::vector<std::pair<size_t, ToolSlot>> run;
    bool resolved = true;
    for (size_t j = i; j < end; ++j) {
      size_t pos = 0;
      if (calls && !msgs[j].tool_call_id.empty())
        for (size_t c = 0; c < calls->size(); ++c)
          if ((*calls)[c].id == msgs[j].tool_call_id) {
            pos = c + 1;
            break;
          }
      if (pos == 0) resolved = false;
      run.emplace_back(pos, ToolSlot{j, pos ? (*calls)[pos - 1].name : std::string()});
    }
    if (resolved) {
      std::stable_sort(run.begin(), run.end(),
                       [](const auto& a, const auto& b) { return a.first < b.first; });
    } else {
      for (size_t k = 0; k < run.size(); ++k) {
        const ChatMessage& m = msgs[run[k].second.message];
        if (m.name && !m.name->empty())
          run[k].second.tool = *m.name;
        else if (calls && k < calls->size())
          run[k].second.tool = (*calls)[k].name;
        else
          throw usage_error(fmt::format(
              "chat: message {}: a tool message whose tool_call_id names no call of the assistant "
              "message before it, and no name",
              run[k].second.message + 1));
      }
    }
    for (auto& [pos, slot] : run) order.push_back(std::move(slot));
    i = end;
  }
  return order;
}

void validate_tools(std::string_view tools, std::string_view what) {
  dom::parser parser;
  dom::element doc;
  if (auto err = parser.parse(tools.data(), tools.size()).get(doc))
    throw usage_error(fmt::format("{}: not valid JSON ({})", what, simdjson::error_message(err)));
  dom::array arr;
  if (doc.get(arr)) throw usage_error(fmt::format("{}: must be an array of tools", what));
  // A key nobody reads is refused by name rather than dropped: a misspelt "parameters" would
  // otherwise declare a function without its arguments. `strict` is accepted (not enforced). A key
  // whose value is null counts as absent, as in the server's request fields.
  auto known_keys = [&](dom::object o, std::string_view where, std::initializer_list<std::string_view> keys) {
    for (dom::key_value_pair kv : o)
      if (!kv.value.is_null() && std::find(keys.begin(), keys.end(), kv.key) == keys.end())
        throw usage_error(
            fmt::format("{}: unknown key '{}' (known: {})", where, kv.key, fmt::join(keys, ", ")));
  };
  size_t i = 0;
  for (dom::element t : arr) {
    const std::string where = fmt::format("{}[{}]", what, i++);
    std::string_view type, name;
    dom::object tool, fn;
    if (t.get(tool)) throw usage_error(fmt::format("{}: must be an object", where));
    if (tool.at_key("type").get(type) || type != "function")
      throw usage_error(fmt::format("{}: 'type' must be \"function\"", where));
    if (tool.at_key("function").get(fn) || fn.at_key("name").get(name) || name.empty())
      throw usage_error(fmt::format("{}: 'function.name' must be a non-empty string", where));
    known_keys(tool, where, {"type", "function"});
    known_keys(fn, where + ".function", {"name", "description", "parameters", "strict"});
    dom::element strict;
    if (fn.at_key("strict").get(strict) == simdjson::SUCCESS && !strict.is_null() && !strict.is_bool())
      throw usage_error(fmt::format("{}.function: 'strict' must be true or false", where));
  }
}

}  // namespace k3::io::text
