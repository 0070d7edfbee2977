// A description of the flow graph as built — nodes, edges, pools — recorded by the graph builder
// next to each tbb::flow node it creates, annotated with run statistics, and written as Graphviz DOT.
#pragma once
#include <atomic>
#include <cstdint>
#include <deque>
#include <filesystem>
#include <string>
#include <vector>

namespace k3::pipeline {

struct NodeStats {
  std::atomic<uint64_t> items{0};
  std::atomic<uint64_t> busy_us{0};
  std::atomic<uint64_t> bytes{0};
};

class GraphDescription {
 public:
  // kind: e.g. "function_node", "async_node", "join_node", "buffer"; concurrency: 0 = unlimited.
  // cluster groups nodes of one stage ("io", "attention", "moe", ...). Returns the node's stats,
  // which stay valid for the description's lifetime.
  NodeStats& add_node(const std::string& id, const std::string& kind, int concurrency,
                      const std::string& cluster);
  void add_pool(const std::string& id, const std::string& cluster, uint64_t slots, uint64_t slot_bytes);
  void add_edge(const std::string& from, const std::string& to, const std::string& label = "");

  void write_dot(const std::filesystem::path& path) const;  // temp name + rename
  std::string to_dot() const;

 private:
  struct Node {
    std::string id, kind, cluster;
    int concurrency;
    bool pool;
    uint64_t slots, slot_bytes;
  };
  struct Edge {
    std::string from, to, label;
  };
  std::vector<Node> nodes_;
  std::deque<NodeStats> stats_;  // parallel to nodes_; deque keeps references stable
  std::vector<Edge> edges_;
};

}  // namespace k3::pipeline
