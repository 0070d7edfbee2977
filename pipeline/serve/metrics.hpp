// `GET /metrics`: the Prometheus text exposition format (version 0.0.4: `# HELP`, `# TYPE`, one
// sample per line). Requests are counted by endpoint and status here; the rest is read from the
// scheduler's gauges and the process when scraped.
#pragma once
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>

#include "pipeline/serve/scheduler.hpp"

namespace k3::pipeline::serve {

class Metrics {
 public:
  void count(std::string_view endpoint, int status);
  std::string render(const Scheduler&) const;

 private:
  mutable std::mutex m_;
  std::map<std::pair<std::string, int>, uint64_t> requests_;
};

}  // namespace k3::pipeline::serve
