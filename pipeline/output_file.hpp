// Output files are never left half-written: bytes go to a temporary name in the same directory,
// which is renamed over the destination only once everything is on disk.
#pragma once
#include <cstddef>
#include <filesystem>
#include <span>
#include <string_view>

namespace k3::pipeline {

// Throws k3::io::Error (runtime) naming `path` on failure; the temporary file is removed.
void write_file_atomic(const std::filesystem::path& path, std::span<const std::byte> bytes);
void write_file_atomic(const std::filesystem::path& path, std::string_view text);

// Before a long run: can `path` be written when the run ends? Creates and removes the temporary
// the write would use. A usage error (exit 2) naming `flag` and the path when it is a directory,
// its directory is missing, or the file cannot be created there.
void check_writable(const std::filesystem::path& path, std::string_view flag);

}  // namespace k3::pipeline
