#include "io/env.hpp"

#include <cstdlib>
#include <stdexcept>
#include <string>

namespace k3::io::env {

const Var& find(std::string_view name) {
  for (const Var& v : kAll)
    if (v.name == name) return v;
  throw std::logic_error("io::env: " + std::string(name) + " is not in io/env.hpp's table");
}

std::optional<std::string_view> text(const Var& v) {
  // Names are literals in the table above, so their data is NUL-terminated.
  const char* s = std::getenv(v.name.data());
  if (s == nullptr || *s == '\0') return std::nullopt;
  return std::string_view(s);
}

bool flag(const Var& v) {
  const auto s = text(v);
  return s && *s != "0";
}

std::optional<int> integer(const Var& v) {
  const auto s = text(v);
  if (!s) return std::nullopt;
  return std::atoi(s->data());
}

int integer_or_zero(const Var& v) {
  return integer(v).value_or(0);
}

std::optional<uint64_t> u64(const Var& v) {
  const auto s = text(v);
  if (!s) return std::nullopt;
  return std::strtoull(s->data(), nullptr, 10);
}

int launcher_ranks() {
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE"})
    if (const char* v = std::getenv(name); v && *v) return std::atoi(v);
  return std::getenv("PMIX_RANK") ? 1 : 0;
}

}  // namespace k3::io::env
