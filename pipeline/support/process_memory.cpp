#include "pipeline/support/process_memory.hpp"

#include <sys/resource.h>

#include <cstdlib>
#include <fstream>
#include <string>

namespace k3::pipeline {

uint64_t proc_field_kb(const char* file, const char* key) {
  std::ifstream f(file);
  std::string line;
  const std::string k = std::string(key) + ":";
  while (std::getline(f, line))
    if (line.rfind(k, 0) == 0) return std::strtoull(line.c_str() + k.size(), nullptr, 10);
  return 0;
}

uint64_t current_rss_bytes() {
  return proc_field_kb("/proc/self/status", "VmRSS") * 1024;
}

uint64_t peak_rss_bytes() {
  if (const uint64_t hwm = proc_field_kb("/proc/self/status", "VmHWM")) return hwm * 1024;
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<uint64_t>(u.ru_maxrss) * 1024;  // Linux reports KiB
}

}  // namespace k3::pipeline
