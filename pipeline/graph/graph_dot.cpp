#include "pipeline/graph/graph_dot.hpp"

#include <cstdio>
#include <map>

#include "io/error.hpp"
#include "pipeline/support/human_bytes.hpp"

namespace k3::pipeline {

namespace {

std::string dot_quoted(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '\n') {  // a line break in a label: DOT's own escape
      out += "\\n";
      continue;
    }
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

}  // namespace

NodeStats& GraphDescription::add_node(const std::string& id, const std::string& kind, int concurrency,
                                      const std::string& cluster) {
  nodes_.push_back({id, kind, cluster, concurrency, false, 0, 0});
  return stats_.emplace_back();
}

void GraphDescription::add_pool(const std::string& id, const std::string& cluster, uint64_t slots,
                                uint64_t slot_bytes) {
  nodes_.push_back({id, "slot pool", cluster, 0, true, slots, slot_bytes});
  stats_.emplace_back();
}

void GraphDescription::add_edge(const std::string& from, const std::string& to, const std::string& label) {
  edges_.push_back({from, to, label});
}

std::string GraphDescription::to_dot() const {
  std::string out = "digraph k3flow {\n  rankdir=LR;\n  node [fontname=\"Helvetica\", fontsize=10];\n";
  std::map<std::string, std::vector<size_t>> clusters;
  for (size_t i = 0; i < nodes_.size(); ++i) clusters[nodes_[i].cluster].push_back(i);
  for (const auto& [cluster, members] : clusters) {
    out += "  subgraph " + dot_quoted("cluster_" + cluster) + " {\n    label=" + dot_quoted(cluster) + ";\n";
    for (size_t i : members) {
      const Node& n = nodes_[i];
      const NodeStats& s = stats_[i];
      std::string label = n.id + "\n" + n.kind;
      if (n.pool) {
        label += "\n" + std::to_string(n.slots) + " x " + human_bytes(double(n.slot_bytes));
      } else {
        label += "\nconcurrency " +
                 (n.concurrency == 0 ? std::string("unlimited") : std::to_string(n.concurrency));
      }
      if (s.items.load() > 0) {
        char buf[128];
        std::snprintf(buf, sizeof buf, "\n%llu items, busy %.3f s", (unsigned long long)s.items.load(),
                      double(s.busy_us.load()) / 1e6);
        label += buf;
        if (s.bytes.load() > 0) label += ", " + human_bytes(double(s.bytes.load()));
      }
      out += "    " + dot_quoted(n.id) + " [label=" + dot_quoted(label) +
             ", shape=" + (n.pool ? "cylinder" : "box") + "];\n";
    }
    out += "  }\n";
  }
  for (const Edge& e : edges_) {
    out += "  " + dot_quoted(e.from) + " -> " + dot_quoted(e.to);
    if (!e.label.empty()) out += " [label=" + dot_quoted(e.label) + "]";
    out += ";\n";
  }
  return out + "}\n";
}

void GraphDescription::write_dot(const std::filesystem::path& path) const {
  std::string text = to_dot();
  std::filesystem::path tmp = path;
  tmp += ".tmp";
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) throw io::runtime_error(path.string() + ": cannot write graph dump");
  bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  ok = (std::fclose(f) == 0) && ok;
  if (!ok) {
    std::filesystem::remove(tmp);
    throw io::runtime_error(path.string() + ": cannot write graph dump (disk full?)");
  }
  std::filesystem::rename(tmp, path);
}

}  // namespace k3::pipeline
