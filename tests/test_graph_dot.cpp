// The DOT dump renders with Graphviz's own `dot`, groups nodes in cluster_ subgraphs, and carries
// pool capacities and the run annotations.
#include <doctest/doctest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "pipeline/graph/graph_dot.hpp"

TEST_CASE("graph dot: clusters, pools, annotations; dot -Tsvg renders it") {
  k3::pipeline::GraphDescription g;
  g.add_pool("trunk_slots", "io", 2, 2'341'216'112);
  auto& reader = g.add_node("trunk_read", "async_node", 0, "io");
  auto& attn = g.add_node("attention", "function_node", 1, "layer");
  g.add_edge("trunk_slots", "trunk_read", "free slot");
  g.add_edge("trunk_read", "attention", "trunk_ready");
  reader.items = 93;
  reader.bytes = 108'810'000'000ull;
  attn.items = 93;
  attn.busy_us = 1'500'000;

  std::string dot = g.to_dot();
  CHECK(dot.find("subgraph \"cluster_io\"") != std::string::npos);
  CHECK(dot.find("subgraph \"cluster_layer\"") != std::string::npos);
  CHECK(dot.find("2 x 2.18 GiB") != std::string::npos);
  CHECK(dot.find("93 items, busy 1.500 s") != std::string::npos);
  CHECK(dot.find("\"trunk_read\" -> \"attention\" [label=\"trunk_ready\"]") != std::string::npos);

  auto dir = std::filesystem::temp_directory_path() / "k3flow_test_dot";
  std::filesystem::create_directories(dir);
  g.write_dot(dir / "g.dot");
  std::string cmd = "dot -Tsvg " + (dir / "g.dot").string() + " -o " + (dir / "g.svg").string();
  REQUIRE(std::system(cmd.c_str()) == 0);
  std::ifstream svg(dir / "g.svg");
  std::stringstream ss;
  ss << svg.rdbuf();
  CHECK(ss.str().find("<svg") != std::string::npos);
  CHECK(ss.str().find("trunk_read") != std::string::npos);
  std::filesystem::remove_all(dir);
}
